"""The hybrid (global leaf ranking, depth by the parent-child rule), the item gate and fates,
against hand-worked trees."""

import math
import random

import pytest

from canopy_ray.core.hierarchy import balanced_tree
from canopy_ray.core.refine import drive, fates, gate, hybrid, raise_by_rule, score_hybrid, score_lazily

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


def test_a_cutoff_drops_chosen_leaves_too_far_below_the_best():
    # of the best half (.6, .45, .4), within .18 of .6: .45 only; within .1: .6 alone
    assert hybrid([FOUR, TWO], [S4, S2], 0.5, cutoff=0.18) == [[(0, 1)], [(1, 2)]]
    assert hybrid([FOUR, TWO], [S4, S2], 0.5, cutoff=0.1) == [[(0, 1)], []]
    assert hybrid([FOUR, TWO], [S4, S2], 0.5, cutoff=0.2) == hybrid([FOUR, TWO], [S4, S2], 0.5)  # .4 is within
    assert hybrid([FOUR, TWO], [S4, S2], 1.0, cutoff=0.25) == hybrid([FOUR, TWO], [S4, S2], 0.5)  # a cut, not a share


def test_a_z_bar_keeps_the_leaves_standing_out_of_the_questions_own_scores():
    # the six leaves: mean .35, standard deviation sqrt(.025) = .158
    assert hybrid([FOUR, TWO], [S4, S2], 1.0, z=1.0) == [[(0, 1)], []]  # bar .508: .6 alone
    assert hybrid([FOUR, TWO], [S4, S2], 1.0, z=0.0) == hybrid([FOUR, TWO], [S4, S2], 0.5)  # bar .35: .6 .45 .4
    assert hybrid([FOUR, TWO], [S4, S2], 1.0, z=0.6) == [[(0, 1)], [(1, 2)]]  # bar .445: .6 .45
    assert hybrid([FOUR, TWO], [S4, S2], 1.0, z=9.0) == [[(0, 1)], []]  # a bar above every leaf keeps the best
    shifted = [{s: 3 * v - 1 for s, v in sc.items()} for sc in (S4, S2)]  # the same bar on any affine scale
    assert hybrid([FOUR, TWO], shifted, 1.0, z=0.6) == hybrid([FOUR, TWO], [S4, S2], 1.0, z=0.6)
    assert hybrid([FOUR, TWO], [S4, S2], 1 / 6, z=0.0) == [[(0, 1)], []]  # the share still caps it


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


def test_score_hybrid_asks_the_leaves_then_only_the_parents_a_chosen_leaf_may_rise_to():
    asked = []

    def score(ask):
        asked.append([(i, n.span) for i, n in ask])
        return [(S4 if i == 0 else S2)[n.span] for i, n in ask]

    # chosen at 1/2: F(0,1) .6, T(1,2) .45, F(1,2) .4; F(1,2) rises to F(0,2) .5, which stops below the root
    scores = drive(score_hybrid([FOUR, TWO], 0.5), score)
    assert asked == [[(0, (0, 1)), (0, (1, 2)), (0, (2, 3)), (0, (3, 4)), (1, (0, 1)), (1, (1, 2))],
                     [(0, (0, 2)), (1, (0, 2))], [(0, (0, 4))]]
    assert (2, 4) not in scores[0]  # no chosen leaf below it
    assert hybrid([FOUR, TWO], scores, 0.5) == hybrid([FOUR, TWO], [S4, S2], 0.5) == [[(0, 2)], [(1, 2)]]
    assert drive(score_hybrid([LONE], 0.5), score) == [{}]  # a lone leaf is kept unscored
    asked.clear()  # unless asked to: then in the first ask, and the rest as before
    assert drive(score_hybrid([LONE, TWO], 0.5, singles=True), score) == [{(0, 1): .6}, {**S2}]
    assert asked == [[(0, (0, 1)), (1, (0, 1)), (1, (1, 2))], [(1, (0, 2))]]


def test_score_hybrid_reads_all_that_hybrid_reads():
    rng = random.Random(0)
    for _ in range(500):  # uneven trees, where leaves stand at different depths, and ties
        roots = [balanced_tree(rng.randint(1, 11), rng.choice((2, 3))) for _ in range(rng.randint(1, 4))]
        full = [{n.span: round(rng.random(), 1) for n, _ in r.walk()} for r in roots]
        share, fallback, lead = rng.choice((0.2, 0.45, 1.0)), rng.choice((0.0, 0.1)), rng.random() < 0.5
        cutoff, z = rng.choice((None, 0.3)), rng.choice((None, 0.0, 0.8))
        asked = []

        def score(ask):
            asked.extend((i, n.span) for i, n in ask)
            return [full[i][n.span] for i, n in ask]

        lazy = drive(score_hybrid(roots, share, fallback, lead, cutoff=cutoff, z=z), score)
        assert len(asked) == len(set(asked))  # each node scored once
        assert (hybrid(roots, lazy, share, fallback, lead, cutoff, z)
                == hybrid(roots, full, share, fallback, lead, cutoff, z))


def test_score_lazily_scores_a_lone_leaf_only_when_asked_to():
    roots = [LONE, TWO]
    assert [n.span for _, n in next(score_lazily(roots))] == [(0, 2)]  # a lone leaf needs no score ...
    assert [(i, n.span) for i, n in next(score_lazily(roots, lone=True))] == [(0, (0, 1)), (1, (0, 2))]
