"""Rendering kept regions as reader evidence, counting tokens, truncating to a cap.

``render(tree, spans)`` is also the node text the encoders embed (one span), so the
reader sees exactly what was scored. Token counting takes a callable so the reader's
own tokenizer can be plugged in; ``count_words`` is the dependency-free default.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

from canopy_ray.core.hierarchy import ItemTree, Span
from canopy_ray.core.items import ImageItem, TableItem, TextItem

TokenCounter = Callable[[str], int]
_WORD = re.compile(r"\w+|[^\w\s]")
GAP = " ... "


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


def render(tree: ItemTree, spans: Sequence[Span]) -> str:
    """The text of the given disjoint spans of one item, in item order; "..." marks a gap."""
    item, spans = tree.item, sorted(spans)
    if isinstance(item, TextItem):
        parts = [" ".join(s.strip() for s in item.sentences[a:b] if s.strip())
                 for a, b in merge_adjacent(spans)]
        return f"{item.title}: {GAP.join(parts)}" if item.title else GAP.join(parts)
    if isinstance(item, TableItem):
        lines = [item.title] if item.title else []
        lines.append(" | ".join(item.header))
        for k, (a, b) in enumerate(merge_adjacent(spans)):
            if k:
                lines.append("...")
            lines.extend(" | ".join(row) for row in item.rows[a:b])
        return "\n".join(lines)
    if isinstance(item, ImageItem):
        caption = f": {item.caption}" if item.caption else ""
        return f"{item.title}{caption} [image {item.path}]"
    lines = [item.title] if item.title else []
    for span in spans:
        t0, t1 = tree.time_range(span)
        frames = ", ".join(_fmt_s(t) for t in tree.frames(span))
        speech = " ".join(s.text.strip() for s in item.transcript if s.start < t1 and s.end > t0)
        line = f"[video {item.path} {_fmt_s(t0)}-{_fmt_s(t1)} s; frames at {frames} s]"
        lines.append(f"{line} {speech}" if speech else line)
    return "\n".join(lines)


def node_text(tree: ItemTree, span: Span) -> str:
    return render(tree, [span])


@dataclass(frozen=True)
class Piece:
    """The kept regions of one item, added to the evidence in round ``round``."""

    item_id: str
    modality: str
    spans: tuple[Span, ...]
    text: str
    round: int = 1
    media: tuple[tuple[str, float | None], ...] = ()  # (path, time) for images/frames


def piece(tree: ItemTree, spans: Sequence[Span], round: int = 1) -> Piece:
    item, spans = tree.item, tuple(sorted(spans))
    if isinstance(item, ImageItem):
        media: tuple = ((item.path, None),)
    elif tree.segments:
        media = tuple((item.path, t) for s in spans for t in tree.frames(s))
    else:
        media = ()
    return Piece(item.id, item.modality, spans, render(tree, spans), round, media)


def render_evidence(pieces: Sequence[Piece]) -> str:
    return "\n\n".join(p.text for p in pieces)


def truncate_newest_first(pieces: Sequence[Piece], cap: int,
                          count: TokenCounter = count_words) -> list[Piece]:
    """Keep the newest pieces whose tokens fit under ``cap``; the oldest go first.

    Pieces are ordered oldest to newest; the result keeps that order.
    """
    kept, total = [], 0
    for p in reversed(pieces):
        n = count(p.text)
        if total + n > cap:
            break
        kept.append(p)
        total += n
    return kept[::-1]
