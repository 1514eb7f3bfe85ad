"""Matched-budget baselines: CANOPY's run replayed, its tokens filled another way.

A fixed-size baseline (``flat`` with m leaves) differs from CANOPY in tokens *and* in what it
keeps, so a quality gap cannot be told from a budget gap. These baselines fix the budget: for
one question they replay a CANOPY run (same queries, same new items per round, so the same
critic trajectory) and give every item exactly the tokens CANOPY's evidence for it counted
(``kept_tokens`` of the CANOPY record, in the reader's tokens), filled by

- ``random``: the item's leaves in a seeded random order (seed, question id, item id);
- ``flat``: the item's leaves by f_theta score (every leaf scored, as the ``flat`` method).

``random_total`` fixes only the question's budget: the leaves of all the round's items in one
seeded random order (seed, question id, round), filling the tokens CANOPY kept of them together;
an item no leaf is drawn from is left out. It is the usual random control; ``random`` is the
stricter one, as it keeps CANOPY's choice of items and of how much of each.

Filling is greedy: a leaf is kept when the evidence with it still counts at most the budget,
otherwise skipped; then one more leaf is added when that brings the count closer to the budget
(over it). So the tokens differ from CANOPY's by less than one leaf (with its item's head, for
``random_total``), on either side, and no single leaf more would bring them closer (the pieces
render with one title, and a gap marker between non-adjacent leaves). Items kept whole by CANOPY
(aggregation tables) have the whole item as budget and stay whole (``random``, ``flat``)."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np

from canopy_ray.compressor import CompressOptions, Compressor, ItemResult
from canopy_ray.core.evidence import TokenCounter, piece, render
from canopy_ray.core.hierarchy import ItemTree, Span
from canopy_ray.core.policy import Policy
from canopy_ray.core.scoring import Terms
from canopy_ray.models.llm.roles import Critique, Outcome, RoleCall, arun_role

KINDS = ("random", "flat", "random_total")


def fill_budget(tree: ItemTree, order: Sequence[Span], budget: int, count_tokens: TokenCounter) -> list[Span]:
    """Leaves taken in ``order`` while the item's rendered evidence stays within ``budget``;
    then the first leaf in ``order`` that brings the count closer to the budget (over it), so
    the tokens match the budget as closely as one more leaf can, on either side."""
    return _fill([lambda kept: count_tokens(render(tree, kept))], [(0, leaf) for leaf in order], budget)[0]


def fill_total(trees: Sequence[ItemTree], order: Sequence[tuple[int, Span]], budget: int,
               count_tokens: TokenCounter) -> list[list[Span]]:
    """:func:`fill_budget` over several items at once: ``order`` holds (item index, leaf), and
    the budget bounds their evidence together; an item with no leaf kept costs nothing, so the
    first leaf of an item also costs its head (title, table header row)."""
    costs = [lambda kept, t=t: count_tokens(render(t, kept)) if kept else 0 for t in trees]
    return _fill(costs, order, budget)


def _fill(costs, order: Sequence[tuple[int, Span]], budget: int) -> list[list[Span]]:
    kept: list[list[Span]] = [[] for _ in costs]
    spent = [cost([]) for cost in costs]
    total = sum(spent)
    for i, leaf in order:
        cost = costs[i](kept[i] + [leaf])
        if total - spent[i] + cost <= budget:
            kept[i], total, spent[i] = kept[i] + [leaf], total - spent[i] + cost, cost
    gap = budget - total
    for i, leaf in order:
        if gap > 0 and leaf not in kept[i] and total - spent[i] + costs[i](kept[i] + [leaf]) - budget < gap:
            kept[i] = kept[i] + [leaf]
            break
    return [sorted(k) for k in kept]


def leaves(tree: ItemTree) -> list[Span]:
    return [n.span for n in tree.nodes() if n.is_leaf]


def item_seed(seed: int, question_id: str, item_id: str) -> int:
    """A stable per-(question, item) seed (``hash()`` of a str changes between processes)."""
    return int.from_bytes(hashlib.sha256(f"{seed}\0{question_id}\0{item_id}".encode()).digest()[:8], "little")


def random_order(tree: ItemTree, seed: int) -> list[Span]:
    spans = leaves(tree)
    return [spans[i] for i in np.random.default_rng(seed).permutation(len(spans))]


def score_order(tree: ItemTree, scores: Mapping[Span, float]) -> list[Span]:
    return sorted(leaves(tree), key=lambda s: -scores[s])  # stable: ties in item order


def budget_result(tree: ItemTree, kept: Sequence[Span], scores: Mapping[Span, float],
                  count_tokens: TokenCounter, round: int = 1) -> ItemResult:
    kept = sorted(kept)
    fate = {n.span: ("kept" if n.span in kept else "dropped") if n.is_leaf else "split" for n in tree.nodes()}
    ev = piece(tree, kept, round)
    return ItemResult(tree, dict(scores), fate, kept, count_tokens(render(tree, [tree.root.span])),
                      count_tokens(ev.text) if kept else 0, ev)


def flat_policy(policy: Policy | None) -> Policy:
    """Every leaf scored as the replayed run's policy scores it (its terms), for f_theta's order."""
    terms = policy.terms if policy is not None and policy.ranked else Terms()
    return Policy("flat", top=1, terms=terms)


def matched_results(kind: str, compressor: Compressor, query_vec: np.ndarray, items: Sequence,
                    opts: CompressOptions, budgets: Mapping[str, int], seed: int, question_id: str) -> list[ItemResult]:
    """Each item cut to ``budgets[item.id]`` tokens by ``kind`` (random or f_theta order), or, for
    ``random_total``, random leaves of all the items within the sum of their budgets."""
    if kind not in KINDS:
        raise ValueError(f"matched kind must be one of {KINDS}, got {kind!r}")
    count = compressor.count_tokens
    if kind == "flat":  # every leaf scored by f_theta (the flat method's scoring), then refilled
        scored = compressor.compress_items(query_vec, items, replace(opts, policy=flat_policy(opts.policy)))
        return [replace(budget_result(r.tree, fill_budget(r.tree, score_order(r.tree, r.scores), budgets[r.id], count),
                                      r.scores, count, opts.round), encoded=r.encoded, encoded_tokens=r.encoded_tokens)
                for r in scored]
    trees = compressor.trees(items, opts)
    if kind == "random_total":
        pool = [(i, leaf) for i, tree in enumerate(trees) for leaf in leaves(tree)]
        rng = np.random.default_rng(item_seed(seed, question_id, f"round {opts.round}"))
        kept = fill_total(trees, [pool[j] for j in rng.permutation(len(pool))],
                          sum(budgets[t.item.id] for t in trees), count)
    else:
        kept = [fill_budget(t, random_order(t, item_seed(seed, question_id, t.item.id)), budgets[t.item.id], count)
                for t in trees]
    return [budget_result(t, k, {}, count, opts.round) for t, k in zip(trees, kept)]


class ReplayBackends:
    """Backends that replay one CANOPY record: its items per round, its critic's decisions, and
    its per-item tokens as budgets; the query encoder, compressor and reader are real."""

    def __init__(self, kind: str, reference: Mapping, encoder, retriever, compressor: Compressor, client,
                 seed: int = 0, question_id: str = ""):
        if kind not in KINDS:
            raise ValueError(f"matched kind must be one of {KINDS}, got {kind!r}")
        self.kind, self.ref = kind, reference
        self.encoder, self.retriever, self.compressor, self.client = encoder, retriever, compressor, client
        self.seed, self.question_id = seed, question_id
        self._round = self._critiques = 0

    async def encode_queries(self, texts):
        return self.encoder.encode_queries(list(texts))

    async def search(self, query_vec, k, modalities=None):
        ids = self.ref["retrieved"][self._round]
        self._round += 1
        return [(i, 0.0) for i in ids]

    async def fetch(self, item_ids):
        return self.retriever.items(item_ids)

    async def compress(self, query_vec, items, opts):
        return matched_results(self.kind, self.compressor, query_vec, items, opts, self.ref["kept_tokens"],
                               self.seed, self.question_id)

    async def llm(self, call: RoleCall):
        if call.role != "critic":
            return await arun_role(self.client, call)
        self._critiques += 1  # the critic after round t: go on with CANOPY's query of round t + 1
        t = self._critiques
        if t < self.ref["rounds"]:
            return Outcome("critic", Critique(False, "", self.ref["queries"][t]))
        return Outcome("critic", Critique(True))
