"""What the cross-encoder costs per question: ``canopy_ray.compress`` over each test question's
given candidates with the shipped hybrid, and with the cross-encoder added to its score
(``models.scorer``, the policy's ``cross`` term) at the study's pick for it, both on every question, the
order swapped from one question to the next, node-vector cache off so that neither reuses the
other's work.

    python benchmarks/cross_cost.py --cross runs/train/minilm-cross/scorer --n 40 --out results/bench/cross_cost.md

Needs the sets ``canopy data convert`` wrote to ``runs/data`` (``scripts/reproduce_eval.sh``).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
from tqdm import tqdm


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/cpu.yaml")
    ap.add_argument("--cross", required=True, help="a cross-encoder scorer (canopy train --scorer cross)")
    ap.add_argument("--weight", type=float, default=0.2, help="the policy's cross term")
    ap.add_argument("--cutoff", type=float, default=0.9, help="the policy's cutoff with the cross-encoder")
    ap.add_argument("--data", default="runs/data")
    ap.add_argument("--n", type=int, default=40, help="test questions per set")
    ap.add_argument("--out", default="results/bench/cross_cost.md")
    args = ap.parse_args(argv)
    import canopy_ray
    from canopy_ray.config import load_config
    from canopy_ray.eval.runs import load_eval_set
    from canopy_ray.eval.study import SETS

    shipped = load_config(args.config, models={"cache_mb": 0})
    policy = replace(shipped.policy, cutoff=args.cutoff, terms=replace(shipped.policy.terms, cross=args.weight))
    cross = shipped.override(models={"scorer": args.cross}, refinement={"policy": str(policy)})
    configs = {"shipped": shipped, f"+ cross {args.weight:g}, cutoff {args.cutoff:g}": cross}
    rows = []
    for s in SETS:
        d = Path(args.data) / s
        es = load_eval_set(s, d / "questions.jsonl", d / "corpus.jsonl", split="test", n=args.n)
        secs = {name: [] for name in configs}
        scored = {name: [] for name in configs}
        for i, q in enumerate(tqdm(es.questions, desc=s)):
            items = [es.items[c] for c in q.candidates]
            order = list(configs) if i % 2 == 0 else list(configs)[::-1]
            for name in order:
                t = time.perf_counter()
                out = canopy_ray.compress(q.question, items, config=configs[name])
                secs[name].append(time.perf_counter() - t)
                scored[name].append(sum(len(r.scores) for r in out))
        for name in configs:  # each set's first question left out: the first of all loads the models
            ms = 1000 * np.array(secs[name][1:])
            rows.append((s, name, len(ms), np.median(ms), np.percentile(ms, 90), np.mean(scored[name][1:])))
    base = {s: p50 for s, name, _, p50, _, _ in rows if name == "shipped"}
    lines = [f"`canopy_ray.compress` per question, test split, given candidates (k = 10), `{args.config}` with "
             f"the node-vector cache off, against the same with the cross-encoder `{Path(args.cross).name}` "
             f"added (`refinement.cross: {args.weight:g}`, `cutoff: {args.cutoff:g}`), alternated per question "
             "in one process; each set's first question left out (the first of all loads the models). Only ratios compare.", "",
             "| set | scorer | questions | p50 ms | p90 ms | nodes scored per question | p50 vs shipped |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {s} | {name} | {n} | {p50:.0f} | {p90:.0f} | {per_q:.1f} | {p50 / base[s]:.2f}x |"
              for s, name, n, p50, p90, per_q in rows]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
