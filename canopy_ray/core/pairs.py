"""Preference pairs for training f_theta and for refinement decision accuracy (CANOPY 3).

For gold leaves G of an item, V = internal nodes that overlap G and have no fully-gold
proper ancestor. For v in V:
- v fully gold: v beats each child (stop here, keep the context);
- v partly gold: each gold-overlapping child beats v, v beats each non-gold child, and
  each gold-overlapping child beats each non-gold child (descend toward gold).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from canopy_ray.core.hierarchy import Node, Span


@dataclass(frozen=True)
class Preference:
    winner: Span
    loser: Span
    child_over_parent: bool = False  # holds on a tie, like refinement's ">="

    def holds(self, scores: Mapping[Span, float]) -> bool:
        a, b = scores[self.winner], scores[self.loser]
        return a >= b if self.child_over_parent else a > b


@dataclass(frozen=True)
class PreferenceNode:
    node: Node
    fully_gold: bool
    pairs: tuple[Preference, ...]

    def correct(self, scores: Mapping[Span, float]) -> bool:
        return all(p.holds(scores) for p in self.pairs)


def _overlap(span: Span, gold: frozenset[int]) -> int:
    return sum(1 for i in range(*span) if i in gold)


def preference_nodes(root: Node, gold_leaves: Iterable[int]) -> list[PreferenceNode]:
    """The nodes V with their pairs, in pre-order. No gold leaves, no instances."""
    gold = frozenset(gold_leaves)
    out: list[PreferenceNode] = []

    def visit(node: Node) -> None:
        if node.is_leaf:
            return
        hits = _overlap(node.span, gold)
        if hits == 0:
            return
        if hits == node.size:
            pairs = tuple(Preference(node.span, c.span) for c in node.children)
            out.append(PreferenceNode(node, True, pairs))
            return  # descendants have a fully-gold ancestor
        golden = [c for c in node.children if _overlap(c.span, gold)]
        other = [c for c in node.children if not _overlap(c.span, gold)]
        pairs = ([Preference(c.span, node.span, child_over_parent=True) for c in golden]
                 + [Preference(node.span, c.span) for c in other]
                 + [Preference(g.span, o.span) for g in golden for o in other])
        out.append(PreferenceNode(node, False, tuple(pairs)))
        for child in golden:
            visit(child)

    visit(root)
    return out
