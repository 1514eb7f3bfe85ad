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

import math
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


def score_lazily(roots: Sequence[Node], margin: float = 0.0,
                 lone: bool = False) -> Generator[Ask, Sequence[float], list[dict[Span, float]]]:
    """Algorithm 1's scores, asked for level by level: only the nodes refinement visits.

    A generator over several trees at once (``roots``): it yields the ``(tree, node)`` pairs
    whose scores it needs next and is sent their scores. First every root that has children (a
    single-node tree is kept whole without a score), then the children
    of every node that is explored (a root, or a child scoring >= its parent when the parent
    splits: some child scores >= it + ``margin``), and so on. It returns one
    ``{span: score}`` per tree, holding exactly the scores :func:`decisions` reads, so
    ``refine(root, scores, margin)`` equals refinement over the fully scored tree. Drive it
    with :func:`drive` (or by hand, awaiting an encoder between levels). ``lone``: score
    single-node trees too (:func:`gate` compares every item's best score).
    """
    scores: list[dict[Span, float]] = [{} for _ in roots]
    explored: Ask = [(i, r) for i, r in enumerate(roots) if r.children]  # a lone leaf is kept unscored
    first = [(i, r) for i, r in enumerate(roots) if r.children or lone]
    if first:
        got = yield first
        for (i, root), s in zip(first, got, strict=True):
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


def raise_by_rule(root: Node, leaves: Sequence[Span], scores: Mapping[Span, float],
                  fallback: float = 0.0) -> list[Span]:
    """Each leaf raised to its parent while the parent scores >= the node (Algorithm 1 keeps a
    node none of whose children beats it), or less than ``fallback`` below it (too close to
    call: keep the context); the maximal raised spans, sorted."""
    parent = {c.span: n.span for n, _ in root.walk() for c in n.children}
    raised = set()
    for s in leaves:
        while s in parent and scores[parent[s]] >= scores[s] - fallback:
            s = parent[s]
        raised.add(s)
    return sorted(s for s in raised if not any(o != s and o[0] <= s[0] and s[1] <= o[1] for o in raised))


def top_leaves(roots: Sequence[Node], scores: Sequence[Mapping[Span, float]], share: float,
               cutoff: float | None = None, z: float | None = None) -> list[list[Span]]:
    """The best ``share`` of the leaves of all trees with children, ranked together (ties in
    tree order), less those scoring more than ``cutoff`` below the best leaf, and less those
    scoring under ``z`` standard deviations above the mean of the leaves' scores (None: no
    bound; the best leaf always stays). ``z`` reads the question's own score distribution, so
    it keeps few leaves when one stands out and more when several do, on any scorer's scale.
    Per tree, its chosen leaves in rank order."""
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share!r}")
    ranked = sorted(((scores[i][n.span], i, n.span) for i, r in enumerate(roots) if r.children
                     for n, _ in r.walk() if n.is_leaf), key=lambda v: -v[0])
    chosen: list[list[Span]] = [[] for _ in roots]
    if not ranked:
        return chosen
    best = ranked[0][0]
    bar = best - cutoff if cutoff is not None else -math.inf
    if z is not None:
        values = [v for v, _, _ in ranked]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        bar = max(bar, min(mean + z * std, best))
    for v, i, s in ranked[:math.ceil(share * len(ranked))]:
        if v >= bar:
            chosen[i].append(s)
    return chosen


def chosen_leaves(roots: Sequence[Node], scores: Sequence[Mapping[Span, float]], share: float,
                  lead: bool = False, cutoff: float | None = None, z: float | None = None) -> list[list[Span]]:
    """The hybrid's chosen leaves per tree: :func:`top_leaves`, and with ``lead`` the first leaf
    of every tree that has one chosen (a passage's first sentence names what it is about: a
    second-hop answer often stands there)."""
    chosen = top_leaves(roots, scores, share, cutoff, z)
    if lead:
        chosen = [c + [(r.span[0], r.span[0] + 1)] if c and (r.span[0], r.span[0] + 1) not in c else c
                  for r, c in zip(roots, chosen)]
    return chosen


def hybrid(roots: Sequence[Node], scores: Sequence[Mapping[Span, float]], share: float,
           fallback: float = 0.0, lead: bool = False, cutoff: float | None = None,
           z: float | None = None) -> list[list[Span]]:
    """The paper's remedy for flat selection (its Appendix G): the best ``share`` of all the
    trees' leaves, ranked together, each raised by :func:`raise_by_rule`, so the parent-child
    rule decides how much context a chosen leaf keeps (``fallback``: see :func:`raise_by_rule`;
    ``lead``: see :func:`chosen_leaves`; ``cutoff``, ``z``: see :func:`top_leaves`). A single-node tree
    (an image, a table kept whole) is kept. Kept spans per tree; ``[]``: nothing of the tree is chosen."""
    chosen = chosen_leaves(roots, scores, share, lead, cutoff, z)
    return [raise_by_rule(r, c, sc, fallback) if r.children else [r.span] for r, c, sc in zip(roots, chosen, scores)]


def score_hybrid(roots: Sequence[Node], share: float, fallback: float = 0.0, lead: bool = False,
                 singles: bool = False, cutoff: float | None = None,
                 z: float | None = None) -> Generator[Ask, Sequence[float], list[dict[Span, float]]]:
    """The scores :func:`hybrid` reads, asked for level by level like :func:`score_lazily`: every
    leaf of every tree with children (they are ranked together), then the parent of each chosen
    leaf, then the parent of each node that rose, while :func:`raise_by_rule` lets it rise. A tree
    with no chosen leaf, and the nodes above where a leaf stops, are never scored; ``hybrid``
    over these scores equals ``hybrid`` over every node's. ``singles``: the first ask holds every
    single-node tree's root too (``hybrid`` keeps such a tree whatever it scores; a caller may read it)."""
    scores: list[dict[Span, float]] = [{} for _ in roots]
    ask = [(i, n) for i, r in enumerate(roots) if r.children or singles for n, _ in r.walk() if n.is_leaf]
    if not ask:
        return scores
    parent = [{c.span: n for n, _ in r.walk() for c in n.children} for r in roots]

    def record(ask: Ask, got: Sequence[float]) -> None:
        for (i, node), s in zip(ask, got, strict=True):
            scores[i][node.span] = float(s)

    record(ask, (yield ask))
    rising = {(i, s) for i, c in enumerate(chosen_leaves(roots, scores, share, lead, cutoff, z)) for s in c}
    while rising := {(i, s) for i, s in rising if s in parent[i]}:  # a root rises no further
        ask = list({(i, parent[i][s].span): (i, parent[i][s]) for i, s in sorted(rising)
                    if parent[i][s].span not in scores[i]}.values())
        if ask:
            record(ask, (yield ask))
        rising = {(i, parent[i][s].span) for i, s in rising
                  if scores[i][parent[i][s].span] >= scores[i][s] - fallback}
    return scores


def fates(root: Node, kept: Sequence[Span]) -> dict[Span, str]:
    """Every node's fate for spans chosen other than by :func:`decisions` (the hybrid, an item
    left out): ``kept``, ``within`` a kept node, ``split`` above one, else ``dropped``."""
    out = {}
    for n, _ in root.walk():
        a, b = n.span
        if n.span in kept:
            out[n.span] = KEPT
        elif any(k[0] <= a and b <= k[1] for k in kept):
            out[n.span] = WITHIN
        elif any(a <= k[0] and k[1] <= b for k in kept):
            out[n.span] = SPLIT
        else:
            out[n.span] = DROPPED
    return out


def gate(best: Sequence[float], below: float) -> list[bool]:
    """Which items stay: those whose best scored node is within ``below`` of the best item's
    (an item far below the question's best is left out, however refinement cut it)."""
    top = max(best, default=0.0)
    return [b >= top - below for b in best]
