"""Convert raw benchmark files into canopy-ray's canonical corpus and question files.

``convert(fmt, in_path, out_dir)`` reads one raw file (HotpotQA, NQ-open oracle or
TAT-QA), writes ``corpus.jsonl`` (items, via :func:`~canopy_ray.core.items.item_to_dict`),
``questions.jsonl`` (via :func:`~canopy_ray.core.items.question_to_dict`) and
``report.json``, and returns a :class:`~canopy_ray.data.records.ConvertReport`. Every
record goes through ``parse_item``/``parse_question`` before it is written, so what lands
on disk is exactly what a loader accepts.

This module is only the dispatcher: each format module (``hotpotqa``, ``nq``, ``tatqa``)
converts its records, and the helpers they all share (reading raw files, the
:class:`~canopy_ray.data.records.Sink` that validates and counts, ids, value matching)
live in :mod:`canopy_ray.data.records`.

Counting rules (the same for every format):

- ``skipped``: records or items dropped as malformed, by reason (a bad record never
  stops the run);
- ``gold_located`` / ``gold_unlocated``: gold entries written with leaf indexes /
  written whole (empty ``leaves``) because no leaf could be pinned down;
- ``unlocated``: each gold reference that could not be pinned to leaves, by reason
  (a supporting fact out of range, an answer found in no sentence, a table value found
  in no row...). A reference that names no usable item produces no gold entry at all
  but is still counted here.

Command line (the ``canopy data convert`` subcommand calls :func:`main`)::

    python -m canopy_ray.data.convert --format hotpotqa IN [IN...] OUT_DIR [--seed 0] [--n-distractors 9]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

from canopy_ray.core.files import write_json, write_jsonl
from canopy_ray.data.records import ConvertError, ConvertReport, Sink, read_records

FORMATS = ("hotpotqa", "nq", "tatqa")
DEFAULT_DISTRACTORS = 9


# ---------------------------------------------------------------- entry points


def convert_records(fmt: str, records: Iterable[Any], *, seed: int = 0,
                    n_distractors: int = DEFAULT_DISTRACTORS, distractors: str = "random", embed=None
                    ) -> tuple[list[dict], list[dict], ConvertReport]:
    """Convert raw records in memory: ``(items, questions, report)``, all canonical dicts."""
    if fmt == "hotpotqa":
        from canopy_ray.data.hotpotqa import convert_hotpotqa as run
        kwargs = {}
    elif fmt == "nq":
        from canopy_ray.data.nq import convert_nq as run
        kwargs = {"seed": seed, "n_distractors": n_distractors, "distractors": distractors, "embed": embed}
    elif fmt == "tatqa":
        from canopy_ray.data.tatqa import convert_tatqa as run
        kwargs = {}
    else:
        raise ConvertError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if n_distractors < 0:
        raise ConvertError("n_distractors must be >= 0")
    sink = Sink(fmt)
    run(records, sink, **kwargs)
    return sink.finish()


def convert(fmt: str, in_path: str | os.PathLike | Sequence[str | os.PathLike], out_dir: str | os.PathLike, *,
            seed: int = 0, n_distractors: int = DEFAULT_DISTRACTORS, distractors: str = "random",
            embed=None) -> ConvertReport:
    """Convert ``in_path`` (one raw file, or several of one data set: one corpus, one question
    file, so one document-level split) and write ``corpus.jsonl``, ``questions.jsonl`` and
    ``report.json``. ``seed``, ``n_distractors``, ``distractors`` and ``embed`` only matter for
    NQ (distractor passages per question: :func:`canopy_ray.data.nq.convert_nq`).
    """
    if fmt not in FORMATS:
        raise ConvertError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    paths = [in_path] if isinstance(in_path, (str, os.PathLike)) else list(in_path)
    records = (r for p in paths for r in read_records(p))
    items, questions, report = convert_records(fmt, records, seed=seed, n_distractors=n_distractors,
                                               distractors=distractors, embed=embed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "corpus.jsonl", items)
    write_jsonl(out / "questions.jsonl", questions)
    write_json(out / "report.json", report.to_dict(), indent=2)
    return report


def _frozen_embed(config: str | None):
    """f0 of questions and of passages (as text nodes), for hard distractors."""
    from canopy_ray.config import load_config
    from canopy_ray.core.evidence import Piece
    from canopy_ray.models.encoder import build_encoder

    f0 = build_encoder(load_config(config).models, adapter=False)

    def embed(questions, passages):
        return (f0.encode_queries(questions),
                f0.encode_nodes([Piece("p", "text", ((0, 1),), t) for t in passages]))
    return embed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="canopy data convert",
        description="Convert a raw benchmark file into corpus.jsonl and questions.jsonl.")
    parser.add_argument("--format", required=True, choices=FORMATS, dest="fmt")
    parser.add_argument("in_path", nargs="+", help="raw file(s) of one data set: HotpotQA .json/.jsonl, "
                        "NQ .jsonl(.gz), TAT-QA .json")
    parser.add_argument("out_dir", help="directory for corpus.jsonl, questions.jsonl, report.json")
    parser.add_argument("--seed", type=int, default=0, help="distractor draw seed (nq)")
    parser.add_argument("--n-distractors", type=int, default=DEFAULT_DISTRACTORS,
                        help="distractor passages per question (nq; default %(default)s)")
    parser.add_argument("--distractors", choices=["random", "hard"], default="random",
                        help="nq: other questions' passages at random, or the same split's passages nearest "
                             "to the question by BM25 and the frozen encoder, none holding an answer")
    parser.add_argument("--config", default=None, help="the frozen encoder of --distractors hard (models)")
    args = parser.parse_args(argv)
    embed = None
    if args.distractors == "hard":
        embed = _frozen_embed(args.config)
    try:
        report = convert(args.fmt, args.in_path, args.out_dir, seed=args.seed,
                         n_distractors=args.n_distractors, distractors=args.distractors, embed=embed)
    except ConvertError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report.summary())
    print(f"wrote {Path(args.out_dir) / 'corpus.jsonl'} and {Path(args.out_dir) / 'questions.jsonl'}")
    return 0


if __name__ == "__main__":
    # the classes the format modules share (BadLine, Malformed...) live in records.py, so
    # running this file as ``__main__`` makes no second copy of them
    sys.exit(main())
