"""A fused node scorer's decisions on gold items: chosen on validation, reported on test.

Each node v of a gold item is scored

    s(v) = a cos(f0(q), f_theta(v)) + b cross(q, v) + c BM25(q, v) + beta log(words(v))

where ``cross`` is the cross-encoder node scorer (:mod:`canopy_ray.models.cross`, a probability),
BM25 is scaled to [0, 1] within the item, and the length term lets a parent (longer) win more
of its comparisons with its children when beta > 0: the cross-encoder alone prunes too much.
Refinement is Algorithm 1 at margin 0 (:func:`canopy_ray.core.refine.refine`), measured as
``canopy eval-refinement`` does (decision accuracy, gold recall). The rule, fixed before test was
read: on validation, the most accurate weights whose gold recall is at least ``--recall``;
every candidate's validation and test rows are written.

    python -m canopy_ray.eval.fusion --cross DIR [--cache runs/refinement-cache] [--out results/refinement/fusion]
"""

from __future__ import annotations

import argparse
import itertools
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from canopy_ray.core.evidence import node_text
from canopy_ray.core.files import cached_array, write_json, write_text
from canopy_ray.core.lexical import scaled_bm25
from canopy_ray.core.metrics import decision_accuracy, gold_recall, refinement_stats
from canopy_ray.core.refine import refine

GRID = [(a, b, c, beta) for a, b, c, beta in itertools.product(
    (0, 1), (0, 0.1, 0.25, 0.5, 1), (0, 0.1, 0.2, 0.4), (-0.02, 0, 0.01, 0.02, 0.04, 0.06, 0.1)) if a or b]
TERMS = ("cos", "cross", "bm25", "log_words")


def node_terms(gold, f0, f_theta, cross, cache_dir) -> list[dict]:
    """Per gold item ``{term: {span: value}}`` for the four terms."""
    from canopy_ray.eval.refinement import query_vectors, score_items

    cos = score_items(gold, query_vectors(gold, f0, cache_dir), f_theta, cache_dir)
    pairs = [(gi.question.question, [node_text(gi.tree, s) for s in c]) for gi, c in zip(gold, cos)]
    flat = cached_array(cache_dir, "cross", [cross.adapter_id, pairs],
                        lambda: np.concatenate([cross.score(q, ts) for q, ts in pairs] or [np.zeros(0)]))
    out, at = [], 0
    for c, (q, texts) in zip(cos, pairs):
        spans = list(c)
        out.append({"cos": c, "cross": dict(zip(spans, flat[at:at + len(spans)].tolist())),
                    "bm25": dict(zip(spans, scaled_bm25(q, texts))),
                    "log_words": {s: math.log(max(1, len(t.split()))) for s, t in zip(spans, texts)}})
        at += len(spans)
    return out


def measure(gold, terms: Sequence[dict], weights: Sequence[float]) -> tuple[float, float]:
    """Decision accuracy and gold recall of Algorithm 1 over the fused scores."""
    stats = []
    for gi, t in zip(gold, terms):
        scores = {s: sum(w * t[k][s] for w, k in zip(weights, TERMS)) for s in t["cos"]}
        stats.append(refinement_stats(gi.tree.root, scores, refine(gi.tree.root, scores), gi.gold))
    return decision_accuracy(stats), gold_recall(stats)


def main(argv=None) -> int:
    from canopy_ray.config import load_config, resolve_path
    from canopy_ray.data.sets import SHARED_SETS, default_shared_root, prepare_shared
    from canopy_ray.eval.refinement import collect
    from canopy_ray.models.cross import CrossScorer
    from canopy_ray.models.encoder import build_encoder, frozen_nodes

    p = argparse.ArgumentParser(prog="python -m canopy_ray.eval.fusion", description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/cpu.yaml")
    p.add_argument("--cross", required=True, help="a cross-encoder node scorer (canopy train --scorer cross)")
    p.add_argument("--adapter", default=None, help="f_theta adapter dir (default: the config's)")
    p.add_argument("--recall", type=float, default=0.80, help="the gold recall the chosen weights keep on validation")
    p.add_argument("--shared-data", default=default_shared_root())
    p.add_argument("--work-dir", default="runs/data")
    p.add_argument("--cache", default="runs/refinement-cache", help="query/node vectors and cross scores")
    p.add_argument("--out", default="results/refinement/fusion")
    args = p.parse_args(argv)
    cfg = load_config(args.config)
    dirs = prepare_shared(args.shared_data, args.work_dir, list(SHARED_SETS))
    f_theta = build_encoder(cfg.models.model_copy(update={"adapter": args.adapter or resolve_path(cfg.models.adapter)}))
    cross = CrossScorer(args.cross, max_length=cfg.models.max_length)
    rows, data = {}, {}
    for split in ("validation", "test"):
        gold = collect(dirs, split, cfg.hierarchy.branching)
        data[split] = gold, node_terms(gold, frozen_nodes(f_theta), f_theta, cross, args.cache)
        rows[split] = [measure(*data[split], w) for w in GRID]
    ok = [i for i, (_, rec) in enumerate(rows["validation"]) if rec >= args.recall]
    chosen = max(ok, key=lambda i: rows["validation"][i][0]) if ok else None
    by_set = {}  # the chosen weights, per data set
    if chosen is not None:
        from canopy_ray.core.splits import family

        gold, terms = data["test"]
        for name in sorted({family(gi.dataset) for gi in gold}):
            pick = [k for k, gi in enumerate(gold) if family(gi.dataset) == name]
            by_set[name] = measure([gold[k] for k in pick], [terms[k] for k in pick], GRID[chosen])

    def row(i: int) -> str:
        cells = [str(x) for x in GRID[i]] + [f"{100 * v:.1f}" for v in (*rows["validation"][i], *rows["test"][i])]
        return "| " + " | ".join(f"**{c}**" if i == chosen else c for c in cells) + " |"

    head = [f"Fused node scores, Algorithm 1 on gold items (`python -m canopy_ray.eval.fusion`); chosen on "
            f"validation: the most accurate with gold recall >= {100 * args.recall:.0f}% (**bold**).", "",
            "| a cos | b cross | c BM25 | beta log words | val. acc. | val. recall | test acc. | test recall |",
            "|---|---|---|---|---|---|---|---|"]
    order = sorted(range(len(GRID)), key=lambda i: -rows["validation"][i][0])
    sets = ["", "The chosen weights on test, per data set:", "", "| data set | acc. | gold recall |", "|---|---|---|"]
    sets += [f"| {name} | {100 * a:.1f} | {100 * r:.1f} |" for name, (a, r) in by_set.items()]
    out = Path(args.out)
    write_text(out / "fusion.md", "\n".join(head + [row(i) for i in order] + (sets if by_set else [])) + "\n")
    write_json(out / "fusion.json", {"grid": [list(w) for w in GRID], "terms": TERMS, "rows": rows, "chosen": chosen,
                                     "test_by_set": by_set, "recall": args.recall, "cross": Path(args.cross).name})
    print("\n".join(head[2:] + ([row(chosen)] if chosen is not None else ["(no weights keep that recall)"])))
    print(f"wrote {out}/fusion.md, fusion.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
