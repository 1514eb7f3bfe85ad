"""Which questions train, tune and test, and which gold items they refer to.

The split is by **document**, not by question: :func:`assign_splits` joins questions that
share a document (a gold item or a candidate: TAT-QA's questions of one report share its
table and paragraphs, a HotpotQA paragraph can be one question's gold and another's
distractor) into groups and sends each group to ``train``/``validation``/``test`` by a hash
of the group's smallest document key. So no document of a test question is ever a document
of a training or validation question, and the split depends on the data alone: never on file
order, file or folder names, or question ids. Item ids are the documents' keys; the
converters derive them from content (:mod:`canopy_ray.data.records`), so one paragraph has
one id wherever it occurs. A converter that draws distractors from other questions' gold
items (NQ's) draws them from the gold's own split (:func:`split_of_key`), so they join no
group of another split. :func:`sample_questions` draws a fixed sample by hash too.
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
    """The family of a set name, the part before ``_`` (``nq_open`` -> ``nq``): reports group
    by it; the split does not use it."""
    return dataset.split("_")[0]


def split_of_key(key: str, shares: Sequence[float] = SPLIT_SHARES) -> str:
    """``train``, ``validation`` or ``test`` for a document key, from its hash."""
    h = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) / 0x100000000
    if h < shares[0]:
        return "train"
    return "validation" if h < shares[0] + shares[1] else "test"


def item_key(item_id: str) -> str:
    """The document key of an item (:func:`documents`)."""
    return f"item:{item_id}"


def documents(question: Question) -> list[str]:
    """The document keys of a question: its gold items and its candidates. A question with
    neither is keyed by its own text."""
    keys = [item_key(g.item_id) for g in question.gold]
    keys += [item_key(c) for c in question.candidates]
    return keys or ["question:" + question.question]


def assign_splits(questions: Iterable[Question], shares: Sequence[float] = SPLIT_SHARES) -> dict[str, str]:
    """``{question id: split}``: questions sharing a document key (transitively) form one
    group, and a group's split is :func:`split_of_key` of its smallest key."""
    parent: dict[str, str] = {}

    def root(k: str) -> str:
        parent.setdefault(k, k)
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    keyed = [(q.id, documents(q)) for q in questions]
    for _, keys in keyed:
        for k in keys[1:]:
            a, b = root(keys[0]), root(k)
            if a != b:
                parent[max(a, b)] = min(a, b)  # the root is the group's smallest key
    return {qid: split_of_key(root(keys[0]), shares) for qid, keys in keyed}


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


def in_split(questions: Sequence[Question], split: str | None) -> list[Question]:
    """The questions of ``split`` (all of them when None), in their order."""
    if split is None:
        return list(questions)
    splits = assign_splits(questions)
    return [q for q in questions if splits[q.id] == split]


def gold_items(dataset: str, items: Mapping[str, Item], questions: Sequence[Question],
               split: str | None = None, branching: int = 2, min_leaves: int = 2) -> Iterator[GoldItem]:
    """Gold items with located leaves (and at least ``min_leaves`` leaves) of the questions
    in ``split`` (all questions when None). Gold leaves out of range are dropped."""
    for q in in_split(questions, split):
        for g in q.gold:
            if not g.leaves or g.item_id not in items:
                continue
            tree = build_tree(items[g.item_id], branching)
            gold = frozenset(i for i in g.leaves if i < tree.n_leaves)
            if tree.n_leaves < min_leaves or not gold:
                continue
            yield GoldItem(dataset, q, tree, gold)
