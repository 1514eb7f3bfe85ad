"""Parent-relative refinement (CANOPY Algorithm 1).

Start at the root; explore every child scoring >= its parent (ties explore), drop the
others with their subtrees; keep a node when no child qualifies, and keep leaves when
reached. No threshold, budget or LLM call. The kept spans form an evidence forest.
"""

from __future__ import annotations

from typing import Mapping

from canopy_ray.core.hierarchy import Node, Span

KEPT, SPLIT, DROPPED, WITHIN = "kept", "split", "dropped", "within"


def refine(root: Node, scores: Mapping[Span, float]) -> list[Span]:
    """Kept spans sorted by start. ``scores`` maps every visited node's span to its score."""
    return [span for span, decision in decisions(root, scores).items() if decision == KEPT]


def decisions(root: Node, scores: Mapping[Span, float]) -> dict[Span, str]:
    """Every node's fate, in pre-order: ``split`` (children explored), ``kept``,
    ``dropped`` (below its parent, or under a dropped node) and ``within`` (inside a
    kept node, never visited)."""
    out: dict[Span, str] = {}

    def mark(node: Node, decision: str) -> None:
        for n, _ in node.walk():
            out[n.span] = decision

    def visit(node: Node) -> None:
        if node.is_leaf:
            out[node.span] = KEPT
            return
        parent = scores[node.span]
        explore = [c for c in node.children if scores[c.span] >= parent]
        if not explore:
            out[node.span] = KEPT
            for child in node.children:
                mark(child, WITHIN)
            return
        out[node.span] = SPLIT
        for child in node.children:
            if scores[child.span] >= parent:
                visit(child)
            else:
                mark(child, DROPPED)

    visit(root)
    return out
