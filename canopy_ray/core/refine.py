"""Parent-relative refinement (CANOPY Algorithm 1).

Start at the root; explore every child scoring >= its parent (ties explore), drop the
others with their subtrees; keep a node when no child qualifies, and keep leaves when
reached. No threshold, budget or LLM call. The kept spans form an evidence forest.

A ``margin`` d >= 0 (ours; 0 is the paper) asks more before a node is split: only when some
child scores >= the node + d; then, as in the paper, every child scoring >= the node is
explored. So a larger d splits fewer nodes and never keeps less: every region kept at d covers
regions kept at a smaller margin, the nodes visited at d are a subset of those visited at
0, and lazy scoring asks for no more nodes. (A per-child bar, "explore a child only when it
scores >= its parent + d", would not be monotone: it can drop a child explored at d = 0 while
a sibling still splits the parent.)

Refinement reads only the scores of the nodes it visits, so :func:`score_lazily` asks for
them level by level and nothing else is ever encoded.
"""

from __future__ import annotations

from typing import Callable, Generator, Mapping, Sequence

from canopy_ray.core.hierarchy import Node, Span

KEPT, SPLIT, DROPPED, WITHIN = "kept", "split", "dropped", "within"


def refine(root: Node, scores: Mapping[Span, float], margin: float = 0.0) -> list[Span]:
    """Kept spans sorted by start. ``scores`` maps every visited node's span to its score."""
    return [span for span, decision in decisions(root, scores, margin).items() if decision == KEPT]


def decisions(root: Node, scores: Mapping[Span, float], margin: float = 0.0) -> dict[Span, str]:
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
        if not any(scores[c.span] >= parent + margin for c in explore):
            out[node.span] = KEPT
            for child in node.children:
                mark(child, WITHIN)
            return
        out[node.span] = SPLIT
        for child in node.children:
            if child in explore:
                visit(child)
            else:
                mark(child, DROPPED)

    visit(root)
    return out


Ask = list[tuple[int, Node]]


def score_lazily(roots: Sequence[Node], margin: float = 0.0) -> Generator[Ask, Sequence[float], list[dict[Span, float]]]:
    """Algorithm 1's scores, asked for level by level: only the nodes refinement visits.

    A generator over several trees at once (``roots``): it yields the ``(tree, node)`` pairs
    whose scores it needs next and is sent their scores. First every root that has children (a
    single-node tree is kept whole without a score), then the children
    of every node that is explored (a root, or a child scoring >= its parent when the parent
    splits: some child scores >= it + ``margin``), and so on. It returns one
    ``{span: score}`` per tree, holding exactly the scores :func:`decisions` reads, so
    ``refine(root, scores, margin)`` equals refinement over the fully scored tree. Drive it
    with :func:`drive` (or by hand, awaiting an encoder between levels).
    """
    scores: list[dict[Span, float]] = [{} for _ in roots]
    explored: Ask = [(i, r) for i, r in enumerate(roots) if r.children]  # a lone leaf is kept unscored
    if explored:
        got = yield explored
        for (i, root), s in zip(explored, got, strict=True):
            scores[i][root.span] = float(s)
    while explored:  # nodes whose children are asked next
        ask = [(i, c) for i, n in explored for c in n.children]
        got = yield ask
        for (i, node), s in zip(ask, got, strict=True):
            scores[i][node.span] = float(s)
        nxt = []
        for i, node in explored:  # split when a child beats the node by the margin
            parent, sc = scores[i][node.span], scores[i]
            if any(sc[c.span] >= parent + margin for c in node.children):
                nxt.extend((i, c) for c in node.children if c.children and sc[c.span] >= parent)
        explored = nxt
    return scores


def drive(gen: Generator[Ask, Sequence[float], list], score: Callable[[Ask], Sequence[float]]) -> list:
    """Run :func:`score_lazily` to the end with a synchronous ``score`` function."""
    try:
        ask = next(gen)
        while True:
            ask = gen.send(score(ask))
    except StopIteration as done:
        return done.value
