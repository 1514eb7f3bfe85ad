"""The fused scorer's terms and decisions on the hand-worked item of the refinement evaluation."""

import math

from canopy_ray.eval.fusion import GRID, measure, node_terms
from tests.eval.test_refinement_eval import BAD, GOLD, GOOD, PairScorer


def test_each_term_comes_from_its_scorer_and_the_weights_pick_them():
    (terms,) = node_terms([GOLD], BAD, BAD, PairScorer(GOOD), None)
    assert math.isclose(terms["cos"][(2, 3)], 0.7, abs_tol=1e-6) and math.isclose(terms["cross"][(2, 3)], 0.3, abs_tol=1e-6)
    assert set(terms["bm25"].values()) == {0.0}  # "which?" shares no word with the item
    assert math.isclose(terms["log_words"][(0, 4)], math.log(11))  # the title "T:" and 10 words
    assert measure([GOLD], [terms], (1, 0, 0, 0)) == (0.5, 0.0)  # BAD's cosine alone: the hand-worked numbers
    assert measure([GOLD], [terms], (0, 1, 0, 0)) == (1.0, 1.0)  # GOOD's, through the cross term
    # a heavy length term: every parent beats its children, so the root is kept whole; the root's
    # decision (its gold child should win) is wrong, the fully gold (0, 2)'s (keep it) right
    assert measure([GOLD], [terms], (0, 0, 0, 1)) == (0.5, 1.0)
    assert all(a or b for a, b, _, _ in GRID)  # no candidate without a semantic term
