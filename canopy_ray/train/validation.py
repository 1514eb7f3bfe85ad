"""Choosing checkpoints on validation without losing recall.

Training only sees preference pairs, so decision accuracy can rise while refinement prunes
more gold: the issue-12 adapter gained 16 points of NQ accuracy and lost 5 of NQ recall.
Each checkpoint is therefore scored on a fixed seeded sample of ``validation`` gold items
per data set family, exactly as :mod:`canopy_ray.eval.refinement` scores them (every node
of the item's tree, Algorithm 1, :func:`canopy_ray.core.metrics.refinement_stats`), at the
inference token length, and a checkpoint *qualifies* when every family's gold recall is at
least f0's (minus ``training.recall_tolerance``). The best checkpoint is the qualifying one
with the highest decision accuracy over all families; when none qualifies, the one with
the highest gold recall (``fallback``). f0 itself (step 0) is the reference, not a candidate.

:func:`canopy_ray.train.prepare.gold_part` builds the loop's view of the sample (node texts
cached below the LoRA layers); :func:`score_report`, :func:`qualifies`, :func:`rank_key` and
:func:`best_entry` are pure.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from canopy_ray.core.metrics import decision_accuracy, gold_recall, pruned_share, refinement_stats
from canopy_ray.core.refine import refine
from canopy_ray.core.splits import GoldItem, family

ALL = "all"


def sample_gold(gold: Sequence[GoldItem], per_family: int | None, seed: int) -> list[GoldItem]:
    """Up to ``per_family`` seeded random gold items of each family, in their original order."""
    by_fam: dict[str, list[int]] = defaultdict(list)
    for k, gi in enumerate(gold):
        by_fam[family(gi.dataset)].append(k)
    keep: list[int] = []
    rng = np.random.default_rng(seed)
    for fam in sorted(by_fam):
        ks = by_fam[fam]
        keep.extend(ks if not per_family or per_family >= len(ks)
                    else [ks[i] for i in rng.permutation(len(ks))[:per_family]])
    return [gold[k] for k in sorted(keep)]


def gold_rows(gold: Sequence[GoldItem]) -> tuple[list[str], list[str], list[tuple]]:
    """``(queries, texts, items)``: distinct query and node texts, and per gold item
    ``(family, query_row, root, gold_leaves, ((span, text_row), ...))``."""
    from canopy_ray.core.evidence import node_text

    queries = sorted({gi.question.question for gi in gold})
    q_row = {q: k for k, q in enumerate(queries)}
    t_row: dict[str, int] = {}
    items = []
    for gi in gold:
        rows = tuple((n.span, t_row.setdefault(node_text(gi.tree, n.span), len(t_row)))
                     for n in gi.tree.nodes())
        items.append((family(gi.dataset), q_row[gi.question.question], gi.tree.root, gi.gold, rows))
    return queries, list(t_row), items


def score_report(items: Sequence[tuple], node_vecs: np.ndarray, queries: np.ndarray) -> dict:
    """``{family: {items, decision_accuracy, gold_recall, pruned_share}}`` plus ``all``, from
    node vectors (rows of ``items``) and f0 query vectors: s = cos(f0(q), f(v))."""
    stats: dict[str, list] = defaultdict(list)
    for fam, qi, root, gold, rows in items:
        s = np.asarray(node_vecs)[[r for _, r in rows]] @ np.asarray(queries[qi])
        scores = {span: float(x) for (span, _), x in zip(rows, s)}
        st = refinement_stats(root, scores, refine(root, scores), gold)
        stats[fam].append(st)
        stats[ALL].append(st)
    return {f: {"items": len(v), "decision_accuracy": decision_accuracy(v),
                "gold_recall": gold_recall(v), "pruned_share": pruned_share(v)}
            for f, v in sorted(stats.items())}


def qualifies(report: Mapping, f0: Mapping, tolerance: float = 0.0) -> bool:
    """Whether every family's gold recall is at least f0's minus ``tolerance``."""
    return all(report[f]["gold_recall"] >= f0[f]["gold_recall"] - tolerance
               for f in f0 if f != ALL)


def rank_key(report: Mapping, f0: Mapping, tolerance: float = 0.0) -> tuple:
    """Larger is better: qualifying before not; then decision accuracy (qualifying) or gold
    recall (not qualifying), then the other as tie-break."""
    a, r = report[ALL]["decision_accuracy"], report[ALL]["gold_recall"]
    return (1, a, r) if qualifies(report, f0, tolerance) else (0, r, a)


def best_entry(curve: Sequence[Mapping], tolerance: float = 0.0) -> dict | None:
    """The best trained entry of a curve (``{"step", "report"}``; step 0 is f0, the reference),
    with ``qualifies`` and ``fallback`` set; None without trained entries."""
    f0 = next((e["report"] for e in curve if e["step"] == 0), None)
    trained = [e for e in curve if e["step"] > 0]
    if f0 is None or not trained:
        return None
    best = max(trained, key=lambda e: (rank_key(e["report"], f0, tolerance), -e["step"]))
    ok = qualifies(best["report"], f0, tolerance)
    return {**best, "qualifies": ok, "fallback": not ok}


def since_best(curve: Sequence[Mapping], tolerance: float = 0.0) -> int:
    """Validations after the best one (the early-stopping count)."""
    best = best_entry(curve, tolerance)
    return 0 if best is None else sum(e["step"] > best["step"] for e in curve)


def plot_curve(curve: Sequence[Mapping], path: str | Path, title: str = "") -> Path:
    """Decision accuracy (solid) and gold recall (dashed) per family over steps; f0's recall
    as a dotted line per family: the recall floor a checkpoint must stay above."""
    from canopy_ray.plots import pyplot, save

    plt = pyplot()

    fams = sorted({f for e in curve for f in e["report"]}, key=lambda f: (f == ALL, f))
    steps = [e["step"] for e in curve]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    f0 = next((e["report"] for e in curve if e["step"] == 0), None)
    for k, fam in enumerate(fams):
        c = f"C{k}"
        ax.plot(steps, [100 * e["report"][fam]["decision_accuracy"] for e in curve], "-o",
                color=c, ms=3, label=f"{fam} acc.")
        ax.plot(steps, [100 * e["report"][fam]["gold_recall"] for e in curve], "--s", color=c,
                ms=3, label=f"{fam} recall")
        if f0 is not None:
            ax.axhline(100 * f0[fam]["gold_recall"], color=c, ls=":", lw=0.8)
    best = best_entry(curve)
    if best is not None:
        ax.axvline(best["step"], color="k", lw=0.8, label=f"chosen (step {best['step']})")
    ax.set_xlabel("step")
    ax.set_ylabel("% (validation)")
    ax.set_title(title or "validation: decision accuracy and gold recall", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    return save(fig, path, 110)
