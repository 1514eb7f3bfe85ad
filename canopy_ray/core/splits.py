"""Which questions train, tune and test, and which gold items they refer to.

:func:`split_of` assigns every question to ``train``/``validation``/``test`` by a hash of
its data set family and id, so the split never depends on file order or on which other sets
are loaded: training, validation and every evaluation read the same split, and no test
question leaks into training. :func:`sample_questions` draws a fixed sample the same way.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Sequence

from canopy_ray.core.hierarchy import ItemTree, build_tree
from canopy_ray.core.items import Item, Question

SPLITS = ("train", "validation", "test")
# Shares of questions in train / validation; the rest is test.
SPLIT_SHARES = (0.70, 0.15)


def family(dataset: str) -> str:
    """``hotpotqa_dev700`` and ``hotpotqa_train100`` are one family, ``hotpotqa``."""
    return dataset.split("_")[0]


def split_of(dataset: str, question_id: str, shares: Sequence[float] = SPLIT_SHARES) -> str:
    """``train``, ``validation`` or ``test`` for a question, from a hash of ``family:id``,
    so a question keeps its split whichever file of its family it came from."""
    h = int(hashlib.sha1(f"{family(dataset)}:{question_id}".encode()).hexdigest()[:8], 16) / 0x100000000
    if h < shares[0]:
        return "train"
    return "validation" if h < shares[0] + shares[1] else "test"


def sample_questions(questions: Sequence[Question], n: int | None = None, seed: int = 0) -> list[Question]:
    """A fixed sample: questions ordered by a hash of ``seed:id`` (independent of file order
    and of the other questions), the first ``n`` taken; ``n=None`` keeps all, in that order."""
    order = sorted(questions, key=lambda q: hashlib.sha1(f"{seed}:{q.id}".encode()).hexdigest())
    return order if n is None else order[:n]


@dataclass(frozen=True)
class GoldItem:
    """One gold item of one question, with located leaves and its tree."""

    dataset: str
    question: Question
    tree: ItemTree
    gold: frozenset[int]


def gold_items(dataset: str, items: Mapping[str, Item], questions: Iterable[Question],
               split: str | None = None, branching: int = 2, min_leaves: int = 2) -> Iterator[GoldItem]:
    """Gold items with located leaves (and at least ``min_leaves`` leaves) of the questions
    in ``split`` (all questions when None). Gold leaves out of range are dropped."""
    for q in questions:
        if split is not None and split_of(dataset, q.id) != split:
            continue
        for g in q.gold:
            if not g.leaves or g.item_id not in items:
                continue
            tree = build_tree(items[g.item_id], branching)
            gold = frozenset(i for i in g.leaves if i < tree.n_leaves)
            if tree.n_leaves < min_leaves or not gold:
                continue
            yield GoldItem(dataset, q, tree, gold)
