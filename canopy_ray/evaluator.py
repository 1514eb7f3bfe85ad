"""The ``evaluate`` verb: run methods over a questions file and write run JSONs.

    from canopy_ray.config import load_config
    from canopy_ray.evaluator import evaluate
    out = evaluate(load_config("configs/cpu.yaml"), "questions.jsonl", corpus="corpus.jsonl",
                   methods="shipped,vanilla", n=40, out="runs/eval")

Each method's run (:mod:`canopy_ray.eval.runs`: per-question records and an ``aggregate``
of every metric with its 95% bootstrap interval) is written to ``OUT/<dataset>_<method>.json``
(or to ``OUT`` itself when it ends in ``.json`` and there is one method); with several
methods and ``shipped`` (the configured policy) among them, ``comparison.json`` holds the paired
differences against it. Methods run one after the other in this process, each file written as its
run ends, ``shipped`` first: the matched-budget methods (``random``, ``flat_matched``,
``random_total``) replay its run (without it among the methods they replay a reader-free run made
for them). ``--policy`` replaces the config's ``refinement.policy``, so ``shipped`` is then that
policy; every run's spec records its policy's text.
``--llm-url`` points the reader and critic at an OpenAI-compatible server instead of the
config's LLM. For many points in parallel on Ray, use :mod:`canopy_ray.eval.sweep`.
:func:`main` is the command line (``jobs/eval.py``, ``canopy eval``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable

from canopy_ray.eval.methods import parse_methods
from canopy_ray.core.files import write_json
from canopy_ray.eval.runs import Runner, comparison, load_eval_set
from canopy_ray.models.llm.endpoint import llm_override


def evaluate(cfg, questions: str | Path, corpus: str | Path | None = None, *, methods="shipped",
             setting: str = "given", index: str | Path | None = None, dataset: str | None = None,
             n: int | None = None, seed: int = 0, split: str | None = None, k: int | None = None,
             branching: int | None = None, rounds: int | None = None, flat_m: int | None = None,
             margin: float | None = None,
             out: str | Path | None = None, client=None, llm_cache: str | Path | None = None,
             encoder=None, progress: Callable[[str], None] | None = None, reader: bool = True,
             question_progress: Callable[[int, int], None] | None = None,
             reference: str | Path | None = None) -> dict:
    """Run ``methods`` (``"all"``, a comma list or a list) and return ``{"runs": {method: run},
    "comparison": {...}, "paths": [...]}``; ``client`` defaults to the config's LLM. ``reference``:
    a ``shipped`` run JSON of the same sample and settings for the matched-budget methods to
    replay (instead of running it again)."""
    chosen = parse_methods(methods)
    chosen.sort(key=lambda m: m.name != "shipped")  # stable: shipped first, the others as given
    if out is not None and Path(out).suffix == ".json" and len(chosen) != 1:
        raise ValueError("--out FILE.json takes one method; give a folder for several")
    name = dataset or Path(questions).parent.name or "questions"
    eval_set = load_eval_set(name, questions, corpus, n=n, seed=seed, setting=setting, split=split)
    if client is None:
        from canopy_ray.models.llm import client_from_config

        client = client_from_config(cfg.llm)
    if llm_cache:
        from canopy_ray.eval.cache import CachedChatClient

        client = CachedChatClient(client, llm_cache)
    idx = None
    if setting == "open":
        if index is None:
            raise ValueError("the open setting needs --index")
        from canopy_ray.index import load_index

        idx = load_index(index, nprobe=cfg.retrieval.nprobe)  # Serve's search knob, from the same config
    runner = Runner(cfg, client, encoder=encoder, index=idx)
    base = runner.base_settings()
    margin = cfg.margin if margin is None else margin  # the canopy method's (Algorithm 1)
    flat_m = flat_m or cfg.hierarchy.flat_m
    runs, paths = {}, []
    out = Path(out) if out is not None else None
    for method in chosen:
        # the method's own values win: vanilla stays one round whatever ``rounds`` says
        settings = method.settings(base, k=k, branching=branching, rounds=rounds, flat_m=flat_m, margin=margin)
        if method.matched and reference is not None:
            runner.add_reference(eval_set, settings, json.loads(Path(reference).read_text()), setting, idx)
        run = runner.run(eval_set, method, settings, setting, progress=question_progress, reader=reader)
        runs[method.name] = run
        if out is not None:  # now, so a killed evaluation keeps its finished methods
            paths.append(out if out.suffix == ".json" else out / f"{name}_{method.name}.json")
            write_json(paths[-1], run)
        if progress:
            agg = run["aggregate"]
            progress(f"{name} {method.name}: em {agg['em']['mean']} f1 {agg['f1']['mean']} "
                     f"answer_recall {agg['answer_recall']['mean']} tokens {agg['tokens']['mean']} "
                     f"({run['wall_s']:.0f} s)")
    comp = comparison(runs) if len(runs) > 1 else {}
    if out is not None and out.suffix != ".json" and comp:
        paths.append(out / "comparison.json")
        write_json(paths[-1], {"baseline": "shipped", "dataset": name, "differences": comp})
    return {"runs": runs, "comparison": comp, "paths": [str(p) for p in paths]}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="canopy eval",
                                description="Evaluate methods over a questions file and write run JSONs.")
    p.add_argument("--config", default="configs/cpu.yaml")
    p.add_argument("--questions", required=True, help="canonical questions.jsonl")
    p.add_argument("--corpus", default=None, help="canonical corpus.jsonl (given setting: the candidates)")
    p.add_argument("--index", default=None, help="index folder (open setting)")
    p.add_argument("--setting", default="given", choices=["given", "open"])
    p.add_argument("--method", default="shipped", help="method, comma list, or 'all' (default %(default)s)")
    p.add_argument("--dataset", default=None, help="name in the results (default: the questions' folder)")
    p.add_argument("--n", type=int, default=None, help="fixed sample of this many questions (default: all)")
    p.add_argument("--seed", type=int, default=0, help="sample order seed")
    p.add_argument("--split", default=None, choices=["train", "validation", "test"])
    p.add_argument("--k", type=int, default=None)
    p.add_argument("--branching", type=int, default=None)
    p.add_argument("--rounds", type=int, default=None, help="R for multi-round methods")
    p.add_argument("--flat-m", type=int, default=None, help="leaves per item of the flat method")
    p.add_argument("--margin", type=float, default=None,
                   help="Algorithm 1's margin for the canopy method (default: the config's calibrated one)")
    p.add_argument("--policy", default=None, help="replace the config's refinement.policy (the shipped method's), "
                   "e.g. 'canopy margin=0'")
    p.add_argument("--adapter", default=None, help="f_theta adapter folder (default: the config's)")
    p.add_argument("--llm-cache", default=None, help="SQLite file caching LLM replies (greedy: exact)")
    p.add_argument("--llm-url", default=None, metavar="URL",
                   help="an OpenAI-compatible server (base URL ending in /v1) as reader and critic, "
                        "instead of the config's LLM")
    p.add_argument("--llm-model", default=None, metavar="M",
                   help="the served model's name (default: the first one the server lists)")
    p.add_argument("--no-reader", action="store_true",
                   help="skip the reader: reader-independent metrics only (no EM/F1)")
    p.add_argument("--verbose", action="store_true", help="print progress per question")
    p.add_argument("--reference", default=None, metavar="FILE",
                   help="a shipped run JSON (same sample and settings) for random/flat_matched to replay")
    p.add_argument("--out", required=True, help="FILE.json (one method) or a folder")
    return p


def _question_progress(i: int, n: int) -> None:
    print(f"  question {i}/{n} at {time.strftime('%H:%M:%S')}", flush=True)


def _question_bar() -> Callable[[int, int], None]:
    """A progress bar over each method's questions (a new bar when a method starts again at 1)."""
    from tqdm import tqdm

    bar = None

    def update(i: int, n: int) -> None:
        nonlocal bar
        if bar is None or i <= bar.n:
            if bar is not None:
                bar.close()
            bar = tqdm(total=n, unit="question", disable=None)
        bar.update(i - bar.n)
        if i >= n:
            bar.close()

    return update


def main(argv=None) -> int:
    from canopy_ray.config import ConfigError, load_config

    args = build_parser().parse_args(argv)
    try:
        cfg = load_config(args.config, **({"models": {"adapter": args.adapter}} if args.adapter else {}),
                          **({"refinement": {"policy": args.policy}} if args.policy else {}),
                          **llm_override(args.llm_url, args.llm_model))
        result = evaluate(cfg, args.questions, args.corpus, methods=args.method, setting=args.setting,
                          index=args.index, dataset=args.dataset, n=args.n, seed=args.seed, split=args.split,
                          k=args.k, branching=args.branching, rounds=args.rounds, flat_m=args.flat_m,
                          margin=args.margin,
                          out=args.out, llm_cache=args.llm_cache, progress=print, reader=not args.no_reader,
                          question_progress=_question_progress if args.verbose else _question_bar(),
                          reference=args.reference)
    except (ConfigError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for p in result["paths"]:
        print(f"wrote {p}")
    return 0
