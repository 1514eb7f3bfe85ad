"""Parent-relative refinement (CANOPY Algorithm 1).

Start at the root; explore every child scoring >= its parent (ties explore), drop the
others with their subtrees; keep a node when no child qualifies, and keep leaves when
reached. No threshold, budget or LLM call. The kept spans form an evidence forest.

Refinement reads only the scores of the nodes it visits, so :func:`score_lazily` asks for
them level by level and nothing else is ever encoded.
"""

from __future__ import annotations

from typing import Callable, Generator, Mapping, Sequence

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


Ask = list[tuple[int, Node]]


def score_lazily(roots: Sequence[Node]) -> Generator[Ask, Sequence[float], list[dict[Span, float]]]:
    """Algorithm 1's scores, asked for level by level: only the nodes refinement visits.

    A generator over several trees at once (``roots``): it yields the ``(tree, node)`` pairs
    whose scores it needs next and is sent their scores. First every root, then the children
    of every node that is explored (a root, or a child scoring >= its parent), and so on. It
    returns one ``{span: score}`` per tree, holding exactly the scores :func:`decisions`
    reads, so ``refine(root, scores)`` equals refinement over the fully scored tree. Drive it
    with :func:`drive` (or by hand, awaiting an encoder between levels).
    """
    scores: list[dict[Span, float]] = [{} for _ in roots]
    ask: list[tuple[int, Node, float | None]] = [(i, r, None) for i, r in enumerate(roots)]
    while ask:
        got = yield [(i, n) for i, n, _ in ask]
        nxt = []
        for (i, node, parent), s in zip(ask, got, strict=True):
            scores[i][node.span] = float(s)
            if node.children and (parent is None or s >= parent):
                nxt.extend((i, c, float(s)) for c in node.children)
        ask = nxt
    return scores


def drive(gen: Generator[Ask, Sequence[float], list], score: Callable[[Ask], Sequence[float]]) -> list:
    """Run :func:`score_lazily` to the end with a synchronous ``score`` function."""
    try:
        ask = next(gen)
        while True:
            ask = gen.send(score(ask))
    except StopIteration as done:
        return done.value
