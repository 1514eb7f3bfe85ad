"""ONNX Runtime against torch for the MiniLM encoders: speed, vectors, and refinement on the test split.

    python benchmarks/encode_onnx.py --config configs/cpu.yaml --threads 1 [--repeats 3] [--out results/bench/encode_onnx.md]

Speed (interleaved, best of ``--repeats``, as ``encode_speed.py``): the same real node texts
(``encode_speed.node_texts``) encoded by (a) the plain sorted transformers loop, (b)
``TextEncoder.encode_nodes`` with ``models.backend`` torch, onnx (fp32) and onnx-int8, all with
the same length-sorted token-budget batches and the same thread count (torch's, given to ONNX
Runtime as intra-op threads). Vectors: max abs difference and min cosine against torch over all
texts, and the largest change of a vector between its batch and encoding it alone (dynamic int8
quantises activations per batch, so its vectors depend on their batch-mates).

Accuracy: the refinement evaluation (``canopy_ray.eval.refinement.evaluate``, the numbers of
``canopy eval-refinement``) on the gold items of the ``--split`` questions of every shared set,
once per backend (queries and nodes both on that backend), plus the number of gold items
whose kept spans differ from torch's. The issue's rule: adopt a backend as the CPU default
only if it is faster than torch and moves f_theta's decision accuracy by less than 0.5 points.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from encode_speed import (PlainLoop, _pieces, _timed, chunked, max_diff_alone, measure, minilm_setup,  # noqa: E402
                          node_texts, spread_sample)
from floor import SHARED  # noqa: E402

BACKENDS = ("torch", "onnx", "onnx-int8")


def encoders(models_cfg, cache: str | None) -> dict:
    from canopy_ray.models.encoder import TextEncoder

    m = models_cfg
    return {b: TextEncoder(m.encoder_path, m.adapter, m.max_length, m.batch_size, "cpu",
                           batch_tokens=m.batch_tokens or 1024, backend=b, onnx_cache=cache) for b in BACKENDS}


def speed(encs: dict, m, per_item: list[list[str]], chunk_items: int, repeats: int, check: int) -> dict:
    chunks = chunked(per_item, chunk_items)
    texts = [t for c in chunks for t in c]
    tokens = sum(encs["torch"].token_counts(_pieces(texts)))
    plain = f"(a) plain loop: transformers, sorted, batch {m.batch_size}"
    paths = {plain: PlainLoop(m.max_length, m.batch_size)}
    for b, enc in encs.items():
        paths[f"(b) encode_nodes, backend {b}"] = lambda ts, enc=enc: _timed(enc.encode_nodes, _pieces(ts))
    for fn in paths.values():  # warm-up
        fn(texts[:64])
    seconds = measure(paths, chunks, repeats)
    ref = encs["torch"].encode_nodes(_pieces(texts))
    sample = spread_sample(texts, check)
    vec = {}
    for b, enc in encs.items():
        out = enc.encode_nodes(_pieces(texts))
        vec[b] = {"max_abs_diff": float(np.abs(out - ref).max()), "min_cos": float((out * ref).sum(1).min()),
                  "batch_vs_alone": max_diff_alone(enc.encode_nodes, sample, _pieces)}
    return {"texts": len(texts), "items": len(per_item), "tokens": tokens, "seconds": seconds,
            "tokens_per_s": {k: tokens / v for k, v in seconds.items()}, "vectors": vec, "plain": plain,
            "sample": len(sample)}


def test_gold(cfg, split: str, work_dir: str) -> list:
    """Gold items of ``split`` over every shared set, as ``canopy eval-refinement`` collects them."""
    from canopy_ray.data.sets import SHARED_SETS, prepare_shared
    from canopy_ray.eval.refinement import collect

    return collect(prepare_shared(SHARED, work_dir, list(SHARED_SETS)), split, cfg.hierarchy.branching)


def accuracy(encs: dict, gold: list) -> dict:
    """Refinement metrics per backend, and per backend the gold items whose kept spans differ from torch."""
    from canopy_ray.core.files import cached_array
    from canopy_ray.core.refine import refine
    from canopy_ray.eval.refinement import evaluate, score_items
    from canopy_ray.models.encoder import frozen_nodes

    reports, kept = {}, {}
    for b, enc in encs.items():
        with tempfile.TemporaryDirectory() as cache:  # vectors keyed per backend run, never shared
            pair = {"f0": frozen_nodes(enc), "f_theta": enc}
            reports[b] = evaluate(gold, pair, f0=enc, cache_dir=cache)
            queries = sorted({gi.question.question for gi in gold})
            q = dict(zip(queries, cached_array(cache, "queries", [f"queries:{enc.model_id}", queries],
                                               lambda: enc.encode_queries(queries))))
            kept[b] = {label: [refine(gi.tree.root, s) for gi, s in zip(gold, score_items(gold, q, e, cache))]
                       for label, e in pair.items()}
    differ = {b: {label: sum(x != y for x, y in zip(kept[b][label], kept["torch"][label])) for label in kept[b]}
              for b in encs}
    return {"items": len(gold), "reports": reports, "kept_differ": differ}


def tables(sp: dict, acc: dict | None) -> str:
    t = sp["tokens"]
    base = sp["tokens_per_s"]["(b) encode_nodes, backend torch"]
    floor = sp["tokens_per_s"][sp["plain"]]
    lines = ["| path | tokens/s | x torch encode_nodes | x plain loop | max abs diff vs torch | min cosine "
             "vs torch | batch vs alone |", "|---|---|---|---|---|---|---|"]
    for name, s in sp["seconds"].items():
        b = name.rsplit(" ", 1)[-1] if "backend" in name else None
        v = sp["vectors"].get(b, {}) if b else {}
        cells = [name, f"{t / s:.0f}", f"{t / s / base:.3f}", f"{t / s / floor:.3f}"] + (
            [f"{v['max_abs_diff']:.1e}", f"{v['min_cos']:.5f}", f"{v['batch_vs_alone']:.1e}"] if v else ["", "", ""])
        lines.append("| " + " | ".join(cells) + " |")
    out = "\n".join(lines)
    if acc:
        rows = ["| backend | encoder | data set | decision acc. | change vs torch | gold recall | change vs torch "
                "| pruned share | kept tokens | items with other kept spans |", "|" + "---|" * 10]
        ref = acc["reports"]["torch"]
        for b, rep in acc["reports"].items():
            for fam in sorted(rep, key=lambda k: (k != "all", k)):
                for label, r in rep[fam].items():
                    s, s0 = r["summary"], ref[fam][label]["summary"]
                    diff = str(acc["kept_differ"][b][label]) if fam == "all" else ""
                    rows.append(f"| {b} | {label} | {fam} | {100 * s['decision_accuracy']:.2f} | "
                                f"{100 * (s['decision_accuracy'] - s0['decision_accuracy']):+.2f} | "
                                f"{100 * s['gold_recall']:.2f} | {100 * (s['gold_recall'] - s0['gold_recall']):+.2f} | "
                                f"{100 * s['pruned_share']:.1f} | {100 * s['kept_tokens']:.1f} | {diff} |")
        out += "\n\n" + "\n".join(rows)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/cpu.yaml")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--chunk-items", type=int, default=32)
    p.add_argument("--max-items", type=int, default=None)
    p.add_argument("--check", type=int, default=120, help="texts checked against encoding each alone")
    p.add_argument("--threads", type=int, default=None, help="torch threads, also ONNX Runtime's intra-op threads")
    p.add_argument("--split", default="test", help="refinement split; 'none' skips the accuracy part")
    p.add_argument("--work-dir", default="runs/bench-data", help="converted shared data sets")
    p.add_argument("--onnx-cache", default=None, help="exported models (default: $CANOPY_ONNX_CACHE or "
                                                      "~/.cache/canopy-ray/onnx)")
    p.add_argument("--out", default="results/bench/encode_onnx.md")
    p.add_argument("--json", default="runs/bench-encode/onnx.json")
    args, cfg = minilm_setup(p, argv, "ONNX backends are for the MiniLM TextEncoder")
    import torch

    m = cfg.models
    encs = encoders(m, args.onnx_cache)
    source, per_item = node_texts(cfg.hierarchy.branching)
    sp = speed(encs, m, per_item[:args.max_items], args.chunk_items, args.repeats, args.check)
    acc = None if args.split == "none" or not (SHARED / "hotpotqa").is_dir() else accuracy(
        encs, test_gold(cfg, args.split, args.work_dir))
    table = tables(sp, acc)
    notes = (f"Speed: {sp['texts']} node texts of {sp['items']} items ({source}), {sp['tokens']} tokens; "
             f"chunks of {args.chunk_items} items, best of {args.repeats} interleaved passes; torch threads = "
             f"ONNX Runtime intra-op threads = {torch.get_num_threads()}, {os.cpu_count()} CPUs; batches of <= "
             f"{m.batch_size} rows and <= {encs['torch'].batch_tokens} padded tokens for every backend. Vector "
             f"columns over all texts against torch; 'batch vs alone': {sp['sample']} texts encoded in one call "
             f"against each alone.")
    if acc:
        notes += (f"\n\nRefinement: {acc['items']} gold items of the `{args.split}` split (all shared sets), "
                  f"queries and nodes encoded by each backend; 'items with other kept spans' counts gold items "
                  f"whose kept spans differ from torch's (out of {acc['items']}).")
    print(table + "\n\n" + notes)
    cmd = "python benchmarks/encode_onnx.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"Measured by `{cmd.strip()}` on {os.cpu_count()} CPU cores, {date.today()}.\n\n"
                   f"{table}\n\n{notes}\n")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"speed": sp, "accuracy": acc, "config": args.config}, indent=1,
                                          default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
