"""Length-sorted batches for the encoders: little padding, a bound on padded tokens."""

from __future__ import annotations

from typing import Sequence


def length_batches(lengths: Sequence[int], max_rows: int, max_tokens: int | None) -> list[list[int]]:
    """Indices into ``lengths`` (token counts), longest first, cut so that a batch has at most
    ``max_rows`` rows and ``max_tokens`` padded tokens (rows x its longest; one row at least)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
    out, at = [], 0
    while at < len(order):
        rows = max_rows if not max_tokens else max(1, min(max_rows, max_tokens // max(1, lengths[order[at]])))
        out.append(order[at:at + rows])
        at += rows
    return out
