"""Length-sorted batches for the encoders: little padding, a bound on padded tokens."""

from __future__ import annotations

from typing import Sequence


def length_batches(lengths: Sequence[int], max_rows: int, max_tokens: int | None,
                   overhead: int | None = None) -> list[list[int]]:
    """Indices into ``lengths`` (token counts), longest first, cut so that a batch has at most
    ``max_rows`` rows and ``max_tokens`` padded tokens (rows x its longest; one row at least).

    ``overhead``: what one forward pass costs beyond its padded tokens, in tokens. Given, the cuts
    minimise padded tokens + ``overhead`` per batch (a short text is not padded to a long one's
    width when a batch of its own costs less); else each batch takes as many rows as fit."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
    width = [max(1, lengths[i]) for i in order]

    def fits(a: int, b: int) -> bool:  # rows a..b-1 in one batch (the widest first)
        return b - a <= max_rows and (not max_tokens or b - a == 1 or (b - a) * width[a] <= max_tokens)

    if overhead is None:
        cuts, at = [0], 0
        while at < len(order):
            at = max(b for b in range(at + 1, min(len(order), at + max_rows) + 1) if fits(at, b))
            cuts.append(at)
    else:  # best[b]: the least cost of rows 0..b-1; each batch's rows are contiguous in length order
        best, start = [0] + [0] * len(order), [0] * (len(order) + 1)
        for b in range(1, len(order) + 1):
            best[b], start[b] = min((best[a] + overhead + (b - a) * width[a], a)
                                    for a in range(max(0, b - max_rows), b) if fits(a, b))
        cuts, b = [], len(order)
        while b:
            cuts.append(b)
            b = start[b]
        cuts = [0] + cuts[::-1]
    return [order[a:b] for a, b in zip(cuts, cuts[1:])]
