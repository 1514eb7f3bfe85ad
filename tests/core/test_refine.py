from hypothesis import given, strategies as st

from canopy_ray import balanced_tree, refine
from canopy_ray.core.refine import decisions


def test_the_authors_six_sentence_example_keeps_the_first_half_whole():
    root = balanced_tree(6, 2)
    scores = {(0, 6): 0.3749, (0, 3): 0.4041, (3, 6): 0.3528,
              (0, 2): 0.3837, (2, 3): 0.3618, (0, 1): 0.0, (1, 2): 0.0,
              (3, 5): 0.9, (5, 6): 0.9, (3, 4): 0.9, (4, 5): 0.9}
    assert refine(root, scores) == [(0, 3)]
    d = decisions(root, scores)
    assert d[(0, 6)] == "split" and d[(0, 3)] == "kept"
    assert d[(3, 6)] == "dropped" and d[(3, 4)] == "dropped"  # dropped with its subtree
    assert d[(0, 2)] == "within" and d[(2, 3)] == "within"


def test_ties_explore():
    root = balanced_tree(2)
    assert refine(root, {(0, 2): 0.5, (0, 1): 0.5, (1, 2): 0.4}) == [(0, 1)]


def test_both_children_above_the_parent_are_explored():
    root = balanced_tree(4)
    scores = {(0, 4): 0.1, (0, 2): 0.2, (2, 4): 0.3, (0, 1): 0.3, (1, 2): 0.1, (2, 3): 0.0, (3, 4): 0.0}
    assert refine(root, scores) == [(0, 1), (2, 4)]


def test_single_node_tree_keeps_the_root():
    assert refine(balanced_tree(1), {(0, 1): -1.0}) == [(0, 1)]


def test_unvisited_nodes_need_no_score():
    root = balanced_tree(4)
    assert refine(root, {(0, 4): 0.9, (0, 2): 0.1, (2, 4): 0.2}) == [(0, 4)]


def _random_scores(root, data):
    return {n.span: data.draw(st.floats(-1, 1)) for n, _ in root.walk()}


@given(st.integers(1, 60), st.integers(2, 5), st.data())
def test_kept_spans_are_disjoint_tree_nodes_never_nested(n, b, data):
    root = balanced_tree(n, b)
    kept = refine(root, _random_scores(root, data))
    nodes = {node.span for node, _ in root.walk()}
    assert kept and set(kept) <= nodes
    assert kept == sorted(kept)
    for (a0, a1), (b0, b1) in zip(kept, kept[1:]):
        assert a1 <= b0  # disjoint, so neither is an ancestor of the other


@given(st.integers(1, 60), st.integers(2, 5), st.data())
def test_decisions_are_consistent_with_kept(n, b, data):
    root = balanced_tree(n, b)
    scores = _random_scores(root, data)
    d = decisions(root, scores)
    assert set(d) == {node.span for node, _ in root.walk()}
    assert [s for s, v in d.items() if v == "kept"] == refine(root, scores)
    for node, _ in root.walk():
        if d[node.span] == "split":
            assert any(d[c.span] in ("split", "kept") for c in node.children)
            for c in node.children:
                explored = scores[c.span] >= scores[node.span]
                assert (d[c.span] != "dropped") == explored


@given(st.integers(1, 60), st.integers(2, 5))
def test_equal_scores_descend_to_every_leaf(n, b):
    root = balanced_tree(n, b)
    assert refine(root, {node.span: 0.5 for node, _ in root.walk()}) == [(i, i + 1) for i in range(n)]


@given(st.integers(1, 60), st.integers(2, 5))
def test_scores_falling_with_depth_keep_the_root(n, b):
    root = balanced_tree(n, b)
    assert refine(root, {node.span: 1.0 - 0.1 * depth for node, depth in root.walk()}) == [(0, n)]
