from canopy_ray import balanced_tree
from canopy_ray.core.pairs import Preference, preference_nodes


def pairs_of(node):
    return {(p.winner, p.loser, p.child_over_parent) for p in node.pairs}


def test_fully_gold_root_prefers_itself_over_its_children():
    (v,) = preference_nodes(balanced_tree(4), {0, 1, 2, 3})
    assert v.fully_gold and v.node.span == (0, 4)
    assert pairs_of(v) == {((0, 4), (0, 2), False), ((0, 4), (2, 4), False)}


def test_partly_gold_node_descends_toward_gold():
    # 4 leaves, gold {0, 1}: root partly gold, (0, 2) fully gold, (2, 4) non-gold.
    nodes = preference_nodes(balanced_tree(4), {0, 1})
    assert [n.node.span for n in nodes] == [(0, 4), (0, 2)]
    root, left = nodes
    assert not root.fully_gold and left.fully_gold
    assert pairs_of(root) == {((0, 2), (0, 4), True), ((0, 4), (2, 4), False), ((0, 2), (2, 4), False)}
    assert pairs_of(left) == {((0, 2), (0, 1), False), ((0, 2), (1, 2), False)}


def test_nested_gold_visits_only_nodes_without_a_fully_gold_ancestor():
    # 6 leaves: (0,3)|(3,6); (0,3) -> (0,2)|(2,3); gold {1, 3, 4, 5}.
    nodes = preference_nodes(balanced_tree(6), {1, 3, 4, 5})
    spans = [n.node.span for n in nodes]
    assert spans == [(0, 6), (0, 3), (0, 2), (3, 6)]
    by = {n.node.span: n for n in nodes}
    assert by[(3, 6)].fully_gold and not by[(0, 3)].fully_gold
    # (0, 3): gold child (0, 2) beats it; it beats non-gold (2, 3); (0, 2) beats (2, 3).
    assert pairs_of(by[(0, 3)]) == {((0, 2), (0, 3), True), ((0, 3), (2, 3), False),
                                    ((0, 2), (2, 3), False)}
    # leaves are never preference nodes; the fully gold (3, 6)'s children are not visited
    assert (3, 5) not in by and (1, 2) not in by


def test_root_with_both_children_gold_has_only_child_over_parent_pairs():
    (root, *_rest) = preference_nodes(balanced_tree(4), {0, 3})
    assert pairs_of(root) == {((0, 2), (0, 4), True), ((2, 4), (0, 4), True)}


def test_no_gold_or_single_leaf_gives_no_instance():
    assert preference_nodes(balanced_tree(5), set()) == []
    assert preference_nodes(balanced_tree(1), {0}) == []


def test_ties_hold_only_for_child_over_parent():
    scores = {(0, 2): 0.5, (0, 4): 0.5}
    assert Preference((0, 2), (0, 4), child_over_parent=True).holds(scores)
    assert not Preference((0, 4), (0, 2)).holds(scores)


def test_correct_needs_every_preference():
    (root, left) = preference_nodes(balanced_tree(4), {0, 1})
    good = {(0, 4): 0.3, (0, 2): 0.5, (2, 4): 0.1, (0, 1): 0.2, (1, 2): 0.2}
    assert root.correct(good) and left.correct(good)
    assert not root.correct(good | {(2, 4): 0.4})  # non-gold child beats the parent
