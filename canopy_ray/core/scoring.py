"""The one composition of a node's score, shared by the compressor and the study.

    score(v) = cos(f0(q), f_theta(v))
             + cross * p(v holds evidence | q)      the cross-encoder's probability (models.scorer)
             + bm25  * BM25(q, v)                    scaled to [0, 1] over the question's nodes
             + title * [q names v's item by title]   (core.lexical.titled)
             + bridge * max(0, cos(f0(q + b), f_theta(v)) - cos(f0(q), f_theta(v)))   v outside item b
             + link  * [v's item is named by one of the two best items or by an item q names]

The bridge and link terms are the second hop of a chained question, whose answer sits in an
item found through what another item says. The bridge term reads the question again with the
text of the best item ``b`` (by its best leaf under the terms before it) beside it, the critic's
follow-up query made without an LLM: a node counts by the better of its two cosines. The link
term ranks the items the same way and lifts those the two best name by title. Both rank items
by the terms before them, so they are added last (:func:`compose`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, Iterable, Sequence

import numpy as np

from canopy_ray.core.lexical import best_of, named, scaled_bm25


@dataclass(frozen=True)
class Terms:
    """The weights of the terms added to the cosine; 0 leaves a term out."""

    bm25: float = 0.0
    title: float = 0.0
    link: float = 0.0
    cross: float = 0.0
    bridge: float = 0.0

    def __post_init__(self):
        for f in fields(self):
            if not getattr(self, f.name) >= 0:
                raise ValueError(f"{f.name} must be >= 0, got {getattr(self, f.name)!r}")

    def items(self) -> list[tuple[str, float]]:
        """The nonzero weights, in the order they are added."""
        return [(f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name)]

    def __bool__(self) -> bool:
        return bool(self.items())


def lexical(query: str, texts: Sequence[str]) -> list[float]:
    """BM25 of every node against the query, scaled to [0, 1] over all of them at once: a node's
    term must not depend on which other nodes a level of refinement asks for."""
    return scaled_bm25(query, texts)


def linked(titles: Sequence[str | None], body: Callable[[int], str], leaf_scores: Iterable[tuple[int, float]],
           asked: Sequence[int], items: int = 2) -> np.ndarray:
    """Per item, 1.0 when one of the ``items`` best items (by their best leaf in ``leaf_scores``,
    ``(item, score)`` pairs) or of the items the query names (``asked``) names it, else 0.0."""
    best = best_of(len(titles), leaf_scores)
    return np.asarray(named(titles, body, best, items, also=asked), np.float32)


def best_item(item_of: Sequence[int], scores: np.ndarray) -> int:
    """The item of the best-scoring node (the bridge term's item ``b``)."""
    return int(np.asarray(item_of)[int(np.argmax(scores))])


def bridge_query(query: str, item_text: str) -> str:
    """The bridge term's second query: the question, then the best item's text."""
    return f"{query}\n{item_text}"


def compose(cosine: np.ndarray, item_of: Sequence[int], terms: Terms, *, bm25: Sequence[float] | None = None,
            cross: Sequence[float] | None = None, titled: Sequence[bool] | None = None,
            link: Callable[[np.ndarray], np.ndarray] | None = None,
            bridge: Callable[[np.ndarray], tuple[int, np.ndarray]] | None = None) -> np.ndarray:
    """Every asked node's score: its ``cosine`` plus the weighted terms. ``item_of``: each node's
    item; ``bm25`` and ``cross``: per node; ``titled``: per item (the query names it);
    ``link(scores)``: per item 0/1, given the scores before the link term (:func:`linked`);
    ``bridge(scores)``: given the scores before the bridge term, the item ``b`` and every asked
    node's cosine with the bridge query (:func:`bridge_query` of ``b``'s text)."""
    s = np.asarray(cosine, np.float32)
    items = np.asarray(item_of, int)
    if terms.cross:
        s = s + np.float32(terms.cross) * np.asarray(cross, np.float32)
    if terms.bm25:
        s = s + np.float32(terms.bm25) * np.asarray(bm25, np.float32)
    if terms.title and titled is not None and len(items):
        s = s + np.float32(terms.title) * np.asarray(titled, np.float32)[items]
    if terms.bridge and len(items):
        b, again = bridge(s)
        gain = np.maximum(np.asarray(again, np.float32) - np.asarray(cosine, np.float32), 0) * (items != b)
        s = s + np.float32(terms.bridge) * gain
    if terms.link and len(items):
        s = s + np.float32(terms.link) * np.asarray(link(s), np.float32)[items]
    return s
