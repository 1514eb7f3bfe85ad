"""Rendering kept regions as reader evidence, counting tokens, truncating to a cap.

``render(tree, [span])`` is also the node text the encoders embed, so the reader sees
exactly what was scored. Several kept spans of one item render as one piece
(:func:`shown_spans`) that is never longer than the item rendered whole. Token counting
takes a callable so the reader's own tokenizer can be plugged in; ``count_words`` is the
dependency-free default.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from itertools import accumulate
from typing import Callable, Sequence

from canopy_ray.core.hierarchy import ItemTree, Span
from canopy_ray.core.items import ImageItem, TableItem, TextItem

TokenCounter = Callable[[str], int]
_WORD = re.compile(r"\w+|[^\w\s]")
GAP = " ... "  # between the kept parts of a passage
ROW_GAP = "\n...\n"  # between the kept rows of a table
CUT = " ..."  # after the head of a piece cut to the reader cap
PIECE_SEP = "\n\n"  # between the pieces of the evidence
# Raise it whenever node text changes: an index stores the node vectors of the text of its day,
# and the index job rebuilds (or, without --overwrite, refuses) an index made under another
NODE_TEXT_VERSION = 2


def count_words(text: str) -> int:
    """Words and punctuation marks: a tokenizer-free stand-in for token counts."""
    return len(_WORD.findall(text))


def _fmt_s(t: float) -> str:
    return f"{t:g}"


def merge_adjacent(spans: Sequence[Span]) -> list[Span]:
    """Sorted spans with touching neighbours joined: (0, 1), (1, 3) -> (0, 3)."""
    out: list[Span] = []
    for a, b in sorted(spans):
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _file_name(path: str) -> str:
    """A media marker names the file, not where it lies: a reader (maybe remote) has no use for the
    server's directories, and the text, its tokens and its vector stay the same wherever it is installed."""
    return os.path.basename(path)


def _video_line(tree: ItemTree, span: Span) -> str:
    item = tree.item
    t0, t1 = tree.time_range(span)
    frames = ", ".join(_fmt_s(t) for t in tree.frames(span))
    speech = " ".join(s.text.strip() for s in item.transcript if s.start < t1 and s.end > t0)
    line = f"[video {_file_name(item.path)} {_fmt_s(t0)}-{_fmt_s(t1)} s; frames at {frames} s]"
    return f"{line} {speech}" if speech else line


def head(item) -> str:
    """What every piece of ``item`` starts with, whatever was kept: the item's title and, for a
    table, its header row (every node of a table repeats it). A method cannot drop it, so it is
    never evidence of the method's: answer recall reads the :attr:`Piece.body`, which leaves it
    out, and a question whose answer occurs in a shown head is not informative
    (:func:`canopy_ray.core.metrics.informative`)."""
    if isinstance(item, TableItem):
        header = " | ".join(item.header)
        return f"{item.title}\n{header}" if item.title else header
    if not item.title:
        return ""
    if isinstance(item, TextItem):
        return f"{item.title}: "
    return item.title if isinstance(item, ImageItem) else f"{item.title}\n"


def _render(tree: ItemTree, spans: Sequence[Span]) -> str:
    """The given spans as they are, in item order: one part per span, gaps marked, after
    the item's :func:`head`."""
    item, spans = tree.item, sorted(spans)
    if isinstance(item, TextItem):
        parts = [" ".join(s.strip() for s in item.sentences[a:b] if s.strip()) for a, b in spans]
        return head(item) + GAP.join(p for p in parts if p)
    if isinstance(item, TableItem):  # the head ends with the header row
        rows = ROW_GAP.join("\n".join(" | ".join(r) for r in item.rows[a:b]) for a, b in spans)
        return head(item) + (f"\n{rows}" if spans else "")
    if isinstance(item, ImageItem):
        caption = f": {item.caption}" if item.caption else ""
        return f"{head(item)}{caption} [image {_file_name(item.path)}]"
    return head(item) + "\n".join(_video_line(tree, s) for s in spans)


def _span_cost(tree: ItemTree) -> tuple[Callable[[Span], int], int]:
    """(words of one span's part, words of the marker between two parts)."""
    item = tree.item
    if isinstance(item, (TextItem, TableItem)):
        leaves = item.sentences if isinstance(item, TextItem) else [" | ".join(r) for r in item.rows]
        acc = list(accumulate((count_words(x) for x in leaves), initial=0))
        return (lambda s: acc[s[1]] - acc[s[0]]), count_words(GAP if isinstance(item, TextItem) else ROW_GAP)
    return (lambda s: count_words(_video_line(tree, s))), 0


def shown_spans(tree: ItemTree, spans: Sequence[Span]) -> list[Span]:
    """The spans a piece shows for the kept ``spans`` of one item.

    Touching spans are merged (two kept halves of a video are one segment line, not two);
    a gap between kept spans is shown when it costs no more words than the parts on either
    side of it cost apart (the "..." marker, a second video line); and when several spans
    still render longer than the whole item, the whole item is shown. One span is shown as
    it is: it is a node, and its text is what the node encoder embedded.
    """
    out = merge_adjacent(spans)
    if len(out) < 2:
        return out
    cost, marker = _span_cost(tree)
    joined = [out[0]]
    for s in out[1:]:
        both = (joined[-1][0], s[1])
        if cost(both) <= cost(joined[-1]) + marker + cost(s):
            joined[-1] = both
        else:
            joined.append(s)
    whole = [tree.root.span]
    if len(joined) > 1 and count_words(_render(tree, joined)) > count_words(_render(tree, whole)):
        return whole
    return joined


def render(tree: ItemTree, spans: Sequence[Span]) -> str:
    """The text of the given disjoint spans of one item (:func:`shown_spans`), in item order;
    "..." marks a gap. Never more words than ``render(tree, [tree.root.span])``."""
    return _render(tree, shown_spans(tree, spans))


def node_text(tree: ItemTree, span: Span) -> str:
    return render(tree, [span])


@dataclass(frozen=True)
class Piece:
    """The kept regions of one item, added to the evidence in round ``round``.

    ``spans`` are the kept spans; ``text`` and ``media`` show them as :func:`shown_spans` lays
    them out; ``text`` starts with ``head`` (:func:`head`: the title, and a table's header row),
    and the rest is the :attr:`body`."""

    item_id: str
    modality: str
    spans: tuple[Span, ...]
    text: str
    round: int = 1
    media: tuple[tuple[str, float | None], ...] = ()  # (path, time) for images/frames
    head: str = ""

    @property
    def body(self) -> str:
        """The text without its head: what the method chose to show ("" when a cut to the
        reader cap left only part of the head)."""
        return self.text[len(self.head):].removeprefix("\n") if self.text.startswith(self.head) else ""


def piece(tree: ItemTree, spans: Sequence[Span], round: int = 1) -> Piece:
    item, spans = tree.item, tuple(sorted(spans))
    shown = shown_spans(tree, spans)
    if isinstance(item, ImageItem):
        media: tuple = ((item.path, None),)
    elif tree.segments:
        media = tuple((item.path, t) for s in shown for t in tree.frames(s))
    else:
        media = ()
    return Piece(item.id, item.modality, spans, _render(tree, shown), round, media, head(item))


def render_evidence(pieces: Sequence[Piece]) -> str:
    return PIECE_SEP.join(p.text for p in pieces)


def evidence_body(pieces: Sequence[Piece]) -> str:
    """The evidence without the pieces' heads (titles, table header rows): what answer recall
    reads."""
    return PIECE_SEP.join(p.body for p in pieces)


_BREAK = re.compile(r"\n|(?<=[.!?])\s")


def cut_to(text: str, budget: int, count: TokenCounter = count_words) -> str:
    """The head of ``text`` that, followed by :data:`CUT`, counts at most ``budget`` tokens.

    The head ends at a word boundary, or at the last line or sentence end in its second
    half when there is one; "" when not even one word and the marker fit.
    """
    ends = [m.end() for m in re.finditer(r"\S+", text)]
    best, lo, hi = 0, 1, len(ends)
    while lo <= hi:  # the most words whose head fits (counts grow with the head)
        mid = (lo + hi) // 2
        if count(text[:ends[mid - 1]] + CUT) <= budget:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    if not best:
        return ""
    head = text[:ends[best - 1]]
    breaks = [m.start() for m in _BREAK.finditer(head)]
    if breaks and breaks[-1] >= len(head) // 2:
        shorter = head[:breaks[-1]].rstrip()
        if shorter and count(shorter + CUT) <= budget:
            head = shorter
    return head + CUT


def truncate_newest_first(pieces: Sequence[Piece], cap: int,
                          count: TokenCounter = count_words) -> list[Piece]:
    """The newest pieces whose tokens fit under ``cap``; the oldest go first.

    The newest piece that does not fit whole is cut to the tokens left (its head, marked
    with :data:`CUT`) and nothing older is kept, so the reader gets some evidence whenever
    there is any and the cap admits one word and the marker. Pieces are ordered oldest to
    newest; the result keeps that order. The tokens of the result, joined by
    :func:`render_evidence`, never exceed ``cap`` (for a counter that adds up over the
    pieces and their separator, as :func:`count_words` does).
    """
    kept: list[Piece] = []
    total, sep = 0, count(PIECE_SEP)
    for p in reversed(pieces):
        left = cap - total - (sep if kept else 0)
        n = count(p.text)
        if n <= left:
            kept.append(p)
            total += n + (sep if len(kept) > 1 else 0)
            continue
        head = cut_to(p.text, left, count)
        if head:
            kept.append(replace(p, text=head))
        break
    return kept[::-1]
