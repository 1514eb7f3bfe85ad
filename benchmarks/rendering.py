"""What the rendering rule costs: kept spans rendered verbatim against how the evidence shows them.

``core.evidence.shown_spans`` joins two kept parts of an item when the dropped part between them
costs no more words than the "..." marker would (and shows a video or an item whole when its kept
parts would render longer than the whole). ``tokens_after`` and the reader count that rendered
text. This replays the ``shipped`` run JSONs of a results folder (their kept spans, over the
corpora they name) and counts, in the reader's tokens, each item rendered both ways.

    python benchmarks/rendering.py results/eval/given-hybrid [--data runs/data]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", help="folder of run JSONs")
    p.add_argument("--data", default="runs/data", help="converted sets (corpus.jsonl per data set)")
    p.add_argument("--config", default="configs/cpu.yaml")
    args = p.parse_args(argv)
    from canopy_ray.config import load_config
    from canopy_ray.core.evidence import _render, merge_adjacent, render
    from canopy_ray.core.hierarchy import build_tree
    from canopy_ray.data.sets import load_dataset
    from canopy_ray.models.llm.tokens import token_counter

    cfg = load_config(args.config)
    count = token_counter(cfg.llm)
    print("| data set | items | items shown otherwise | tokens, kept spans verbatim | tokens as shown | change |")
    print("|---|---|---|---|---|---|")
    for path in sorted(Path(args.results).rglob("*_shipped.json")):
        run = json.loads(path.read_text())
        items, _ = load_dataset(Path(args.data) / run["spec"]["dataset"])
        verbatim = shown = changed = n = 0
        for rec in run["records"]:
            for item_id, kept in rec.get("kept", {}).items():
                tree = build_tree(items[item_id], run["spec"]["branching"])
                spans = [tuple(s) for s in kept]
                a, b = count(_render(tree, merge_adjacent(spans))), count(render(tree, spans))
                verbatim, shown, changed, n = verbatim + a, shown + b, changed + (a != b), n + 1
        print(f"| {run['spec']['dataset']} ({run['spec']['setting']}) | {n} | {changed} | {verbatim:,} | {shown:,} | "
              f"{shown / verbatim - 1:+.2%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
