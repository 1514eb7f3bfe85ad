"""The hybrid (global leaf ranking, depth by the parent-child rule), the item gate and fates,
against hand-worked trees."""

import math

import pytest

from canopy_ray.core.hierarchy import balanced_tree
from canopy_ray.core.refine import drive, fates, gate, hybrid, raise_by_rule, score_all, score_lazily

FOUR = balanced_tree(4)  # (0,4) (0,2) (0,1) (1,2) (2,4) (2,3) (3,4)
TWO = balanced_tree(2)  # (0,2) (0,1) (1,2)
LONE = balanced_tree(1)
S4 = {(0, 4): .3, (0, 2): .5, (0, 1): .6, (1, 2): .4, (2, 4): .2, (2, 3): .25, (3, 4): .1}
S2 = {(0, 2): .35, (0, 1): .3, (1, 2): .45}


def test_a_leaf_rises_while_its_parent_scores_at_least_as_high():
    assert raise_by_rule(FOUR, [(0, 1)], S4) == [(0, 1)]  # parent .5 < .6: the sentence alone
    assert raise_by_rule(FOUR, [(1, 2)], S4) == [(0, 2)]  # parent .5 >= .4; root .3 < .5
    assert raise_by_rule(FOUR, [(0, 1), (1, 2)], S4) == [(0, 2)]  # (0,1) lies within (0,2)
    assert raise_by_rule(FOUR, [(3, 4)], S4) == [(0, 4)]  # .2 >= .1, and the root's .3 >= .2 too ...
    assert raise_by_rule(FOUR, [(3, 4)], {**S4, (0, 4): .15}) == [(2, 4)]  # ... unless the root is lower
    assert raise_by_rule(FOUR, [(2, 3)], {**S4, (0, 4): .2, (2, 4): .25}) == [(2, 4)]  # a tie rises


def test_hybrid_ranks_the_leaves_of_all_trees_together():
    # leaves by score: .6 F(0,1), .45 T(1,2), .4 F(1,2), .3 T(0,1), .25 F(2,3), .1 F(3,4)
    assert hybrid([FOUR, TWO], [S4, S2], 0.5) == [[(0, 2)], [(1, 2)]]
    assert hybrid([FOUR, TWO], [S4, S2], 1 / 6) == [[(0, 1)], []]  # the second tree left out
    assert hybrid([FOUR, TWO], [S4, S2], 1.0) == [[(0, 4)], [(0, 2)]]  # every leaf: all rise to the roots


def test_hybrid_keeps_a_single_node_tree_and_rejects_a_bad_share():
    assert hybrid([LONE, TWO], [{(0, 1): -1.0}, S2], 0.1) == [[(0, 1)], [(1, 2)]]
    for share in (0, 1.5, -0.2):
        with pytest.raises(ValueError):
            hybrid([TWO], [S2], share)


def test_gate_keeps_items_within_the_bound_of_the_best():
    assert gate([0.5, 0.3, 0.45], 0.1) == [True, False, True]
    assert gate([0.5, 0.3, 0.45], 0.2) == [True, True, True]
    assert gate([0.5, 0.3], math.inf) == [True, True]


def test_fates_of_chosen_spans():
    assert fates(FOUR, [(0, 2)]) == {(0, 4): "split", (0, 2): "kept", (0, 1): "within", (1, 2): "within",
                                     (2, 4): "dropped", (2, 3): "dropped", (3, 4): "dropped"}
    assert set(fates(FOUR, []).values()) == {"dropped"}


def test_score_all_asks_every_node_once_and_lone_roots_are_scored_when_asked():
    asked = []

    def score(ask):
        asked.append(ask)
        return [S4.get(n.span, 0.0) if i == 0 else S2[n.span] for i, n in ask]

    assert drive(score_all([FOUR, TWO]), score) == [S4, S2]
    assert len(asked) == 1 and len(asked[0]) == 10
    roots = [LONE, TWO]
    assert [n.span for _, n in next(score_lazily(roots))] == [(0, 2)]  # a lone leaf needs no score ...
    assert [(i, n.span) for i, n in next(score_lazily(roots, lone=True))] == [(0, (0, 1)), (1, (0, 2))]
