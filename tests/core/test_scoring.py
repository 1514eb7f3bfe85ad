"""The one composition of a node's score (canopy_ray.core.scoring)."""

import numpy as np
import pytest

from canopy_ray.core.scoring import Terms, compose, linked


def test_each_term_adds_its_weight_and_nothing_else():
    cos, item_of = np.array([0.1, 0.2, 0.3]), [0, 0, 1]
    bm25, cross, titled = [1.0, 0.0, 0.5], [0.2, 0.4, 0.6], [False, True]
    assert compose(cos, item_of, Terms()).tolist() == pytest.approx([0.1, 0.2, 0.3])
    got = compose(cos, item_of, Terms(bm25=0.4, title=0.1, cross=0.5), bm25=bm25, cross=cross, titled=titled)
    assert got.tolist() == pytest.approx([0.1 + 0.4 + 0.1, 0.2 + 0.2, 0.3 + 0.2 + 0.3 + 0.1])


def test_the_link_term_comes_last_and_reads_the_scores_before_it():
    seen = []

    def link(partial):
        seen.append(partial.tolist())
        return [0.0, 1.0]

    got = compose(np.array([0.1, 0.2]), [0, 1], Terms(bm25=1.0, link=0.2), bm25=[0.5, 0.0], link=link)
    assert seen == [pytest.approx([0.6, 0.2])]  # BM25 already added when the items are ranked
    assert got.tolist() == pytest.approx([0.6, 0.4])
    assert compose(np.array([0.1]), [0], Terms(), link=lambda p: 1 / 0).tolist() == pytest.approx([0.1])


def test_the_bridge_term_adds_the_gain_of_the_second_query_outside_its_item():
    seen = []

    def bridge(partial):
        seen.append(partial.tolist())
        return 0, np.array([0.9, 0.5, 0.1])  # item 0 is the bridge's; cosines with the second query

    cos, item_of = np.array([0.6, 0.2, 0.3]), [0, 1, 2]
    got = compose(cos, item_of, Terms(bm25=1.0, bridge=0.5), bm25=[0.1, 0.0, 0.0], bridge=bridge)
    assert seen == [pytest.approx([0.7, 0.2, 0.3])]  # read after BM25
    # item 0 gains nothing (its own text is the query), item 1 gains .5 * (.5 - .2), item 2 none (lower)
    assert got.tolist() == pytest.approx([0.7, 0.35, 0.3])
    assert compose(cos, item_of, Terms(), bridge=lambda p: 1 / 0).tolist() == pytest.approx(cos.tolist())


def test_linked_marks_the_items_the_best_ones_or_the_asked_ones_name():
    titles = ["Rosa Marin", "Delta Rovers", "Port Vale Hall", "Quiz"]
    bodies = ["She signed with Delta Rovers.", "A club.", "A hall.", "Rosa Marin played; Port Vale Hall too."]
    # the two best items by their best leaf are 0 and 1: item 0 names Delta Rovers
    assert linked(titles, bodies.__getitem__, [(0, 0.9), (1, 0.8), (2, 0.1), (3, 0.2)], []).tolist() == [0, 1, 0, 0]
    # item 3 asked (the query names it): it names Rosa Marin and Port Vale Hall, whatever it ranks
    assert linked(titles, bodies.__getitem__, [(0, 0.9), (1, 0.8), (2, 0.1), (3, 0.2)], [3]).tolist() == [1, 1, 1, 0]
    # one best item only
    assert linked(titles, bodies.__getitem__, [(1, 0.9), (0, 0.8)], [], items=1).tolist() == [0, 0, 0, 0]


def test_negative_weights_are_refused():
    with pytest.raises(ValueError, match="link must be >= 0"):
        Terms(link=-0.1)
