"""Training instances (q, v) from questions and their gold items (CANOPY section 3).

For each gold entry with located leaves, the item's tree gives the preference nodes V
(:func:`canopy_ray.core.pairs.preference_nodes`); each v in V becomes one
:class:`Instance`: the question, the texts of v and its children (``node_text``, the
text the encoders embed) and the pairs as ``(winner, loser)`` indexes into those texts.
Whole-gold entries (no located leaves) and single-leaf items give no instance.

Data sets are canonical directories (``corpus.jsonl`` + ``questions.jsonl``, written by
:func:`canopy_ray.data.convert.convert`); :func:`split_of` assigns every question to
``train``/``validation``/``test`` by a hash of its data set and id, so the split never
depends on file order or on which other sets are loaded.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from canopy_ray.core.evidence import node_text
from canopy_ray.core.hierarchy import ItemTree, Span, build_tree
from canopy_ray.core.items import Item, Question, parse_item, parse_question
from canopy_ray.core.pairs import preference_nodes

SPLITS = ("train", "validation", "test")
# Shares of questions in train / validation; the rest is test.
SPLIT_SHARES = (0.70, 0.15)

# The shared raw files and the converter format of each, relative to ../shared/data.
SHARED_SETS = {
    "hotpotqa_dev700": ("hotpotqa", "hotpotqa/hotpotqa_distractor_dev700.jsonl"),
    "hotpotqa_train100": ("hotpotqa", "hotpotqa/hotpotqa_train100.json"),
    "nq": ("nq", "nq/nq_open_oracle_1655.jsonl.gz"),
    "tatqa": ("tatqa", "tatqa/tatqa_dev.json"),
}


def split_of(dataset: str, question_id: str, shares: Sequence[float] = SPLIT_SHARES) -> str:
    """``train``, ``validation`` or ``test`` for a question, from a hash of ``dataset:id``.

    ``hotpotqa_dev700`` and ``hotpotqa_train100`` share the family name ``hotpotqa`` so
    a question keeps its split whichever HotpotQA file it came from.
    """
    family = dataset.split("_")[0]
    h = int(hashlib.sha1(f"{family}:{question_id}".encode()).hexdigest()[:8], 16) / 0x100000000
    if h < shares[0]:
        return "train"
    return "validation" if h < shares[0] + shares[1] else "test"


@dataclass(frozen=True)
class GoldItem:
    """One gold item of one question, with located leaves and its tree."""

    dataset: str
    question: Question
    tree: ItemTree
    gold: frozenset[int]


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


def load_dataset(data_dir: str | Path) -> tuple[dict[str, Item], list[Question]]:
    """Items by id and questions of a canonical directory."""
    d = Path(data_dir)
    items = {}
    with open(d / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                item = parse_item(json.loads(line))
                items[item.id] = item
    with open(d / "questions.jsonl", encoding="utf-8") as f:
        questions = [parse_question(json.loads(line)) for line in f if line.strip()]
    return items, questions


def gold_items(dataset: str, items: dict[str, Item], questions: Iterable[Question],
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


def prepare_shared(shared_root: str | Path, out_root: str | Path,
                   names: Sequence[str] | None = None) -> dict[str, Path]:
    """Convert the shared raw sets into ``out_root/<name>/`` (skipping ones already there)."""
    from canopy_ray.data.convert import convert

    out = {}
    for name in names or SHARED_SETS:
        fmt, rel = SHARED_SETS[name]
        d = Path(out_root) / name
        if not ((d / "corpus.jsonl").is_file() and (d / "questions.jsonl").is_file()):
            convert(fmt, Path(shared_root) / rel, d)
        out[name] = d
    return out
