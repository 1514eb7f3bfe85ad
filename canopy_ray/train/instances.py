"""Training instances (q, v) from questions and their gold items (CANOPY section 3).

For each gold entry with located leaves, the item's tree gives the preference nodes V
(:func:`canopy_ray.core.pairs.preference_nodes`); each v in V becomes one
:class:`Instance`: the question, the texts of v and its children (``node_text``, the
text the encoders embed) and the pairs as ``(winner, loser)`` indexes into those texts.
Whole-gold entries (no located leaves) and single-leaf items give no instance.

Data sets are canonical directories (:mod:`canopy_ray.data.sets`); which questions train is
decided by document (:func:`canopy_ray.core.splits.assign_splits`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from canopy_ray.core.evidence import node_text
from canopy_ray.core.hierarchy import Span
from canopy_ray.core.pairs import preference_nodes
from canopy_ray.core.splits import GoldItem, gold_items
from canopy_ray.data.sets import load_dataset


@dataclass(frozen=True)
class Instance:
    """One (q, v): the question, node texts (v first, then its children) and pairs.

    ``pairs`` holds ``(a, b)`` indexes into ``texts``: a should score higher than b.
    ``spans`` are the node spans in the same order as ``texts`` (for tests and debugging).
    """

    dataset: str
    question_id: str
    query: str
    item_id: str
    spans: tuple[Span, ...]
    texts: tuple[str, ...]
    pairs: tuple[tuple[int, int], ...]
    fully_gold: bool


def instances_for(gi: GoldItem) -> list[Instance]:
    """One instance per preference node of a gold item, in pre-order."""
    out = []
    for pn in preference_nodes(gi.tree.root, gi.gold):
        spans = (pn.node.span,) + tuple(c.span for c in pn.node.children)
        index = {s: i for i, s in enumerate(spans)}
        pairs = tuple((index[p.winner], index[p.loser]) for p in pn.pairs)
        texts = tuple(node_text(gi.tree, s) for s in spans)
        out.append(Instance(gi.dataset, gi.question.id, gi.question.question, gi.tree.item.id,
                            spans, texts, pairs, pn.fully_gold))
    return out


def build_instances(data_dirs: dict[str, str | Path], split: str | None = "train",
                    branching: int = 2) -> list[Instance]:
    """All instances of ``split`` over named canonical directories, in a stable order."""
    out: list[Instance] = []
    for name in sorted(data_dirs):
        items, questions = load_dataset(data_dirs[name])
        for gi in gold_items(name, items, questions, split, branching):
            out.extend(instances_for(gi))
    return out
