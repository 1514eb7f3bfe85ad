"""Item hierarchies: leaves per modality and balanced B-ary trees over them.

A node covers a contiguous leaf range ``span = (start, end)`` (end exclusive). A node
of n leaves splits into min(B, n) contiguous parts of near-equal size, earlier parts
larger: with B = 2, 11 -> 6|5 -> (3|3)|(3|2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from canopy_ray.core.items import ImageItem, Item, TableItem, TextItem, VideoItem

Span = tuple[int, int]


@dataclass(frozen=True)
class Node:
    span: Span
    children: tuple["Node", ...] = ()

    @property
    def size(self) -> int:
        return self.span[1] - self.span[0]

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def walk(self, depth: int = 0) -> Iterator[tuple["Node", int]]:
        """Pre-order traversal yielding ``(node, depth)``, the root at depth 0."""
        yield self, depth
        for child in self.children:
            yield from child.walk(depth + 1)


def split_sizes(n: int, branching: int) -> list[int]:
    parts = min(branching, n)
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def balanced_tree(n_leaves: int, branching: int = 2, start: int = 0) -> Node:
    """The balanced ``branching``-ary tree over leaves ``start .. start + n_leaves``."""
    if n_leaves < 1:
        raise ValueError(f"a tree needs at least one leaf, got {n_leaves}")
    if branching < 2:
        raise ValueError(f"branching must be >= 2, got {branching}")
    if n_leaves == 1:
        return Node((start, start + 1))
    children, at = [], start
    for size in split_sizes(n_leaves, branching):
        children.append(balanced_tree(size, branching, at))
        at += size
    return Node((start, start + n_leaves), tuple(children))


def video_segments(duration_s: float, segment_s: float = 30.0) -> list[tuple[float, float]]:
    """Fixed-length segments; the tail shorter than a segment merges into the last one."""
    n = max(1, int(duration_s // segment_s))
    return [(i * segment_s, duration_s if i == n - 1 else (i + 1) * segment_s) for i in range(n)]


def frame_times(start: float, end: float, every_s: float = 10.0, max_frames: int = 32) -> list[float]:
    """Sample times at 0, every_s, 2*every_s... inside [start, end), evenly thinned to max_frames."""
    first = -(-start // every_s) * every_s  # first multiple of every_s >= start
    times = []
    t = first
    while t < end:
        times.append(float(t))
        t += every_s
    if len(times) > max_frames:
        step = (len(times) - 1) / (max_frames - 1) if max_frames > 1 else 0
        times = [times[round(i * step)] for i in range(max_frames)]
    return times


@dataclass(frozen=True)
class ItemTree:
    """An item with its hierarchy. ``segments`` holds video leaf time ranges."""

    item: Item
    root: Node
    segments: tuple[tuple[float, float], ...] = ()
    frame_every_s: float = 10.0
    max_frames: int = 32

    @property
    def n_leaves(self) -> int:
        return self.root.span[1]

    def nodes(self) -> list[Node]:
        return [n for n, _ in self.root.walk()]

    def time_range(self, span: Span) -> tuple[float, float]:
        """Seconds covered by a video node."""
        return self.segments[span[0]][0], self.segments[span[1] - 1][1]

    def frames(self, span: Span) -> list[float]:
        """Frame times of a video node (empty for other modalities)."""
        if not self.segments:
            return []
        return frame_times(*self.time_range(span), self.frame_every_s, self.max_frames)


def n_leaves(item: Item, segment_s: float = 30.0) -> int:
    if isinstance(item, TextItem):
        return len(item.sentences)
    if isinstance(item, TableItem):
        return len(item.rows)
    if isinstance(item, ImageItem):
        return 1
    return len(video_segments(item.duration_s, segment_s))


def build_tree(item: Item, branching: int = 2, segment_s: float = 30.0, frame_every_s: float = 10.0,
               max_frames: int = 32, whole: bool = False) -> ItemTree:
    """The item's hierarchy; ``whole=True`` keeps it as one unsplittable node
    (an aggregation question's table)."""
    n = n_leaves(item, segment_s)
    root = Node((0, n)) if whole else balanced_tree(n, branching)
    segments = tuple(video_segments(item.duration_s, segment_s)) if isinstance(item, VideoItem) else ()
    return ItemTree(item, root, segments, frame_every_s, max_frames)
