"""What updating an index costs: the index job run again after lines are appended to its corpus,
against building the grown corpus from scratch, in one run on one local Ray instance.

    python benchmarks/index_update.py --corpus runs/eval-corpus/all.jsonl --n 2000 --add 200 \\
        --out results/bench/index_update.md

1. **full**: the first ``n + add`` lines indexed into an empty directory.
2. **first**: the first ``n`` lines into another directory; **update**: the same directory after the
   corpus file grew to ``n + add`` lines (only the input shards whose lines changed are embedded).
3. **again**: the update's command once more, nothing changed.

The updated index must equal the full one: the same ids in the same order, and node vectors
within 1e-3 (fp16 storage). Seconds are the job's own (``summary.json``: planning, embedding and
the build; the Ray instance is started once, before).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def max_node_diff(a, b) -> float:
    """Largest absolute difference between the node vectors of two indexes of the same items."""
    assert a.ids == b.ids, "the updated index holds other items than the full build"
    worst = 0.0
    for item_id in a.ids:
        x, y = a.nodes.lookup(item_id), b.nodes.lookup(item_id)
        assert x.keys() == y.keys(), item_id
        worst = max([worst] + [float(np.abs(x[s] - y[s]).max()) for s in x])
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "cpu.yaml"))
    ap.add_argument("--corpus", required=True, help="a JSONL corpus with at least n + add lines")
    ap.add_argument("--n", type=int, default=2000, help="lines of the first corpus")
    ap.add_argument("--add", type=int, default=200, help="lines appended for the update")
    ap.add_argument("--work", type=Path, default=Path("runs/bench-index-update"))
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench" / "index_update.md")
    args = ap.parse_args()

    import shutil

    import ray

    from canopy_ray.config import load_config
    from canopy_ray.index import load_index
    from canopy_ray.indexer import run_index

    cfg = load_config(args.config)
    with open(args.corpus, encoding="utf-8") as f:
        lines = [line for _, line in zip(range(args.n + args.add), f)]
    if len(lines) < args.n + args.add:
        raise SystemExit(f"{args.corpus} has {len(lines)} lines, fewer than n + add = {args.n + args.add}")
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    media_root = Path(args.corpus).resolve().parent
    grown, growing = args.work / "grown.jsonl", args.work / "corpus.jsonl"
    grown.write_text("".join(lines), encoding="utf-8")

    runs = {}
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        index = lambda corpus, out: run_index(cfg, corpus, out, media_root=media_root, progress=False)  # noqa: E731
        runs["full"] = index(grown, args.work / "full")
        growing.write_text("".join(lines[:args.n]), encoding="utf-8")
        runs["first"] = index(growing, args.work / "updated")
        growing.write_text("".join(lines), encoding="utf-8")
        runs["update"] = index(growing, args.work / "updated")
        runs["again"] = index(growing, args.work / "updated")
    finally:
        ray.shutdown()
    diff = max_node_diff(load_index(args.work / "updated"), load_index(args.work / "full"))

    full_s = runs["full"]["seconds"]
    table = [f"# Updating an index: {args.add} lines appended to {args.n}", "",
             f"`python benchmarks/index_update.py --corpus {args.corpus} --n {args.n} --add {args.add}` "
             f"({Path(args.config).name}: index.shard_items {cfg.index.shard_items}, {cfg.index.actors} actors, "
             f"a local Ray of {args.num_cpus} CPUs). Seconds are the job's own (planning, embedding, build); "
             "compare them within this run only.", "",
             "| run | lines | items indexed | input shards embedded / kept | items embedded | embed s | job s | x full |",
             "|---|---|---|---|---|---|---|---|"]
    for name, what in (("full", "grown corpus, empty directory"), ("first", "first corpus"),
                       ("update", "grown corpus, after first"), ("again", "unchanged, after update")):
        s = runs[name]
        table.append(f"| {name}: {what} | {s['input_lines']} | {s['items']} | {s['shards_computed']} / "
                     f"{s['shards_resumed']} | {s['rows_computed']} | {s['embed_seconds']:.1f} | {s['seconds']:.1f} "
                     f"| {s['seconds'] / full_s:.2f} |")
    table += ["", f"The updated index holds the full build's {runs['full']['items']} items in the same order; its "
              f"node vectors differ from the full build's by at most {diff:.2e} (fp16 storage)."]
    text = "\n".join(table) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    (args.work / "results.json").write_text(json.dumps(runs, indent=1))
    print(text)


if __name__ == "__main__":
    main()
