import pytest
from hypothesis import given, strategies as st

from canopy_ray import balanced_tree, refine
from canopy_ray.core.refine import KEPT, decisions


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


@pytest.mark.parametrize("n,scores,kept", [
    # the authors' example, every node scored: (0, 2) and (2, 3) fall below (0, 3), whatever their children
    (6, {(0, 6): 0.3749, (0, 3): 0.4041, (3, 6): 0.3528, (0, 2): 0.3837, (2, 3): 0.3618, (0, 1): 0.9,
         (1, 2): 0.9, (3, 5): 0.9, (5, 6): 0.9, (3, 4): 0.9, (4, 5): 0.9}, [(0, 3)]),
    # 5 -> (3 -> 2|1) | (2 -> 1|1): both halves explored; on the left only the leaf (2, 3) rises,
    # on the right neither leaf does, so (3, 5) is kept whole
    (5, {(0, 5): 0.2, (0, 3): 0.3, (3, 5): 0.25, (0, 2): 0.29, (2, 3): 0.31, (0, 1): 0.9, (1, 2): 0.9,
         (3, 4): 0.1, (4, 5): 0.2}, [(2, 3), (3, 5)]),
    # 4 -> 2|2: the left half ties its parent (explored) and its leaves tie or rise, down to both
    # leaves; the right half is dropped although its leaves score high
    (4, {(0, 4): 0.5, (0, 2): 0.5, (2, 4): 0.4, (0, 1): 0.5, (1, 2): 0.6, (2, 3): 0.9, (3, 4): 0.9},
     [(0, 1), (1, 2)]),
    # 3 -> (2 -> 1|1) | 1: both halves rise; the leaf (2, 3) is kept when reached, and under (0, 2)
    # only (0, 1) rises
    (3, {(0, 3): 0.1, (0, 2): 0.2, (2, 3): 0.15, (0, 1): 0.25, (1, 2): 0.0}, [(0, 1), (2, 3)]),
])
def test_hand_worked_forests(n, scores, kept):
    assert refine(balanced_tree(n, 2), scores) == kept


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
    # Algorithm 1 restated without recursion: a node is kept when every step from the root
    # down to it rises or ties, and no child of it does
    parent = {c.span: node.span for node, _ in root.walk() for c in node.children}
    children = {node.span: [c.span for c in node.children] for node, _ in root.walk()}

    def reached(s):
        return s not in parent or (scores[s] >= scores[parent[s]] and reached(parent[s]))

    expected = sorted(s for s in children if reached(s) and all(scores[c] < scores[s] for c in children[s]))
    assert refine(root, scores) == expected
    assert [s for s, v in d.items() if v == KEPT] == expected
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
