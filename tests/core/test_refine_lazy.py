"""Lazy, level-by-level scoring asks for exactly the nodes Algorithm 1 visits."""

from hypothesis import given, strategies as st

from canopy_ray.core.hierarchy import balanced_tree
from canopy_ray.core.metrics import covered
from canopy_ray.core.refine import KEPT, SPLIT, decisions, drive, refine, score_lazily


def _visited(root, scores, margin=0.0) -> set:
    """Spans whose score refinement reads: the root and the children of every node it
    explores (split, or kept because no child scored >= it)."""
    fate = decisions(root, scores, margin)
    out = {root.span} if root.children else set()
    for node, _ in root.walk():
        if fate[node.span] in (SPLIT, KEPT):
            out.update(c.span for c in node.children)
    return out


@given(st.lists(st.tuples(st.integers(1, 40), st.integers(2, 5)), min_size=1, max_size=4), st.data())
def test_lazy_scores_give_the_same_forest_and_ask_only_visited_nodes(shapes, data):
    roots = [balanced_tree(n, b) for n, b in shapes]
    # few distinct values, so ties (which explore) occur often
    full = [{node.span: data.draw(st.sampled_from([0.1, 0.2, 0.3, 0.4]))
             for node, _ in r.walk()} for r in roots]
    asks = []

    def score(ask):
        asks.append(ask)
        return [full[i][n.span] for i, n in ask]

    lazy = drive(score_lazily(roots), score)
    for root, f, got in zip(roots, full, lazy):
        assert refine(root, got) == refine(root, f)
        assert decisions(root, got) == decisions(root, f)
        assert set(got) == _visited(root, f) and all(got[s] == f[s] for s in got)
    asked = [(i, n.span) for ask in asks for i, n in ask]
    assert len(asked) == len(set(asked))  # no node is asked twice
    # one ask per level, every tree in it: the first holds all the roots but lone leaves
    assert not asks if all(r.is_leaf for r in roots) else [n for _, n in asks[0]] == [r for r in roots if r.children]
    assert len(asks) <= max(_depth(r) for r in roots) + 1


def _depth(node) -> int:
    return 0 if node.is_leaf else 1 + max(_depth(c) for c in node.children)


def test_a_dropped_subtree_is_never_asked():
    root = balanced_tree(4)  # (0,4) -> (0,2) (2,4) -> leaves
    scores = {(0, 4): 0.5, (0, 2): 0.6, (2, 4): 0.1, (0, 1): 0.7, (1, 2): 0.2, (2, 3): 0.9, (3, 4): 0.9}
    asked = []
    got = drive(score_lazily([root]), lambda ask: [asked.append(n.span) or scores[n.span] for _, n in ask])
    assert asked == [(0, 4), (0, 2), (2, 4), (0, 1), (1, 2)]  # (2,3), (3,4) under a dropped node
    assert refine(root, got[0]) == [(0, 1)]


@given(st.lists(st.tuples(st.integers(1, 40), st.integers(2, 5)), min_size=1, max_size=4), st.data(),
       st.sampled_from([0.0, 0.05, 0.1, 0.2]), st.sampled_from([0.05, 0.1, 0.3]))
def test_a_larger_margin_visits_a_subset_and_never_keeps_less(shapes, data, d, more):
    roots = [balanced_tree(n, b) for n, b in shapes]
    full = [{node.span: data.draw(st.sampled_from([0.1, 0.15, 0.2, 0.3, 0.4]))
             for node, _ in r.walk()} for r in roots]
    asked = []
    lazy = drive(score_lazily(roots, d), lambda ask: [asked.append((i, n.span)) or full[i][n.span] for i, n in ask])
    for root, f, got in zip(roots, full, lazy):
        assert decisions(root, got, d) == decisions(root, f, d)
        assert set(got) == _visited(root, f, d)
        assert _visited(root, f, d + more) <= _visited(root, f, d)
        kept, wider = covered(refine(root, f, d)), covered(refine(root, f, d + more))
        assert kept <= wider
        # every region kept at the larger margin covers whole regions kept at the smaller one
        for a, b in refine(root, f, d):
            assert any(x <= a and b <= y for x, y in refine(root, f, d + more))
    assert len(asked) == len(set(asked))


def test_the_margin_on_the_papers_example():
    # the authors' 6-sentence passage: root 0.3749, s0-s2 0.4041 (explore at d = 0), s3-s5 0.3528
    root = balanced_tree(6)
    scores = {(0, 6): 0.3749, (0, 3): 0.4041, (3, 6): 0.3528, (0, 2): 0.3837, (2, 3): 0.3618}
    assert refine(root, scores) == [(0, 3)]
    assert refine(root, scores, margin=0.02) == [(0, 3)]  # 0.4041 >= 0.3749 + 0.02
    assert refine(root, scores, margin=0.03) == [(0, 6)]  # 0.4041 < 0.3779: the root is kept whole
    asked = []
    drive(score_lazily([root], 0.03), lambda ask: [asked.append(n.span) or scores[n.span] for _, n in ask])
    assert asked == [(0, 6), (0, 3), (3, 6)]
