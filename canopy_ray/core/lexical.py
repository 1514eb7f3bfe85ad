"""Lexical evidence for node scores: BM25 of a query against the nodes scored together, which
items the query names, and which items those or the best ones name.

A multi-hop question names the entity its second paragraph is about, and a cosine of small
sentence vectors often misses it; the words do not. Document statistics come from the texts
scored together (one question's nodes), so no corpus-wide index is needed. A bridge question
often does not name its second paragraph at all; its first paragraph does (:func:`named`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Callable, Iterable, Sequence

WORD = re.compile(r"\w+")
QUALIFIER = re.compile(r"\s*\(.*?\)\s*")  # "Chris Summers (ice hockey)" -> "Chris Summers"
STOP = frozenset("a an and are as at be by did do does for from had has have he her his how in is it its "
                 "of on or she that the their them they this to was were what when where which who whom "
                 "whose why will with".split())


def terms(text: str) -> list[str]:
    return [w for w in WORD.findall(text.lower()) if w not in STOP]


class Bm25:
    """BM25 over a collection of texts, its statistics computed once: :meth:`scores` of any
    number of queries against them."""

    def __init__(self, texts: Sequence[str], k1: float = 1.2, b: float = 0.75):
        self.docs = [Counter(terms(t)) for t in texts]
        self.lens = [sum(d.values()) for d in self.docs]
        self.avg, self.k1, self.b = max(sum(self.lens) / max(len(self.lens), 1), 1e-9), k1, b
        self.postings: dict[str, list[int]] = {}
        for k, d in enumerate(self.docs):
            for t in d:
                self.postings.setdefault(t, []).append(k)

    def scores(self, query: str) -> list[float]:
        out = [0.0] * len(self.docs)
        for t in set(terms(query)):
            hits = self.postings.get(t, [])
            idf = math.log(1 + (len(self.docs) - len(hits) + 0.5) / (len(hits) + 0.5))
            for k in hits:
                tf = self.docs[k][t]
                out[k] += idf * tf * (self.k1 + 1) / (tf + self.k1 * (1 - self.b + self.b * self.lens[k] / self.avg))
        return out


def bm25(query: str, texts: Sequence[str], k1: float = 1.2, b: float = 0.75) -> list[float]:
    """BM25 of each text against ``query``, with the texts themselves as the collection."""
    return Bm25(texts, k1, b).scores(query)


def scaled(raw: Sequence[float]) -> list[float]:
    """Scores divided by their largest (all 0 when none is positive): BM25 on [0, 1]."""
    top = max(raw, default=0.0)
    return [x / top for x in raw] if top > 0 else [0.0] * len(raw)


def scaled_bm25(query: str, texts: Sequence[str]) -> list[float]:
    """:func:`bm25` divided by its largest value (all 0 when no text shares a word)."""
    return scaled(bm25(query, texts))


def title_pattern(title: str | None) -> re.Pattern | None:
    """How an item is named: its title, the qualifier in parentheses aside, as whole words
    (lowercase); None for a name under 4 characters, too short to tell from other words."""
    name = QUALIFIER.sub(" ", title or "").strip().lower()
    return re.compile(rf"\b{re.escape(name)}\b") if len(name) >= 4 else None


def named(titles: Sequence[str | None], body: Callable[[int], str], best: Sequence[float | None],
          items: int = 2, also: Iterable[int] = ()) -> list[bool]:
    """Per item: whether one of the ``items`` items with the highest ``best`` score (None: not
    ranked) or of ``also``, other than itself, names it (:func:`title_pattern`) in its body
    (``body(i)``, asked of those items only)."""
    top = sorted((i for i, b in enumerate(best) if b is not None), key=lambda i: -best[i])[:items]
    texts = {i: body(i).lower() for i in {*top, *also}}
    patterns = [title_pattern(t) for t in titles]
    return [p is not None and any(p.search(text) for i, text in texts.items() if i != j)
            for j, p in enumerate(patterns)]


def titled(titles: Sequence[str | None], query: str) -> list[bool]:
    """Per item: whether the query names it (:func:`title_pattern`): a bridge question's first
    paragraph is often the entity it names, and that paragraph names the second."""
    query = query.lower()
    return [p is not None and p.search(query) is not None for p in map(title_pattern, titles)]


def best_of(n: int, scored: Iterable[tuple[int, float]]) -> list[float | None]:
    """Each of ``n`` items' highest score among ``(item, score)`` pairs (None: none given), the
    ``best`` that :func:`named` ranks items by."""
    best: list[float | None] = [None] * n
    for i, v in scored:
        best[i] = v if best[i] is None else max(best[i], v)
    return best
