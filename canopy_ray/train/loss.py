"""The pairwise preference loss of CANOPY section 3.

For an instance (q, v) with pairs P(v):
    l = log(1 + sum_{(a, b) in P(v)} exp(lambda * (s(q, b) - s(q, a))))
with s(q, x) = cos(f0(q), f_theta(x)). Computed as ``logsumexp([0, lambda * (s_b - s_a)...])``
so large margins neither overflow nor underflow.
"""

from __future__ import annotations

from typing import Sequence

import torch


def pair_loss(s: torch.Tensor, pairs: Sequence[tuple[int, int]], lam: float = 1.0) -> torch.Tensor:
    """``log(1 + sum exp(lam * (s_b - s_a)))`` over ``pairs`` (winner a, loser b) indexing the
    scores ``s``: the bi-encoder's cosines, or the cross-encoder's logits."""
    a = torch.tensor([p[0] for p in pairs], dtype=torch.long, device=s.device)
    b = torch.tensor([p[1] for p in pairs], dtype=torch.long, device=s.device)
    z = lam * (s[b] - s[a])
    return torch.logsumexp(torch.cat([s.new_zeros(1), z]), dim=0)


def instance_loss(query: torch.Tensor, nodes: torch.Tensor, pairs: Sequence[tuple[int, int]],
                  lam: float) -> torch.Tensor:
    """Loss of one instance. ``query`` (d,) and ``nodes`` (k, d) are unit vectors;
    ``pairs`` index ``nodes`` as (winner, loser)."""
    return pair_loss(nodes @ query, pairs, lam)


def batch_loss(queries: torch.Tensor, node_vecs: torch.Tensor,
               groups: Sequence[tuple[int, Sequence[int], Sequence[tuple[int, int]]]],
               lam: float) -> torch.Tensor:
    """Mean instance loss over a batch.

    ``queries`` (m, d) and ``node_vecs`` (n, d) hold each distinct query and node text of
    the batch once; each group is ``(query_row, node_rows, pairs)`` with ``pairs``
    indexing ``node_rows``.
    """
    losses = [instance_loss(queries[qi], node_vecs[list(rows)], pairs, lam)
              for qi, rows, pairs in groups]
    return torch.stack(losses).mean()
