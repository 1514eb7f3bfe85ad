"""Refinement evaluation against a hand-worked item with hand-set scores (fake encoders)."""

import math

import numpy as np

from canopy_ray.core.evidence import node_text
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import Gold, Question, TextItem
from canopy_ray.eval.refinement import evaluate, plot_by_depth, to_markdown, truncate
from canopy_ray.core.splits import GoldItem

# 4 sentences of 2, 3, 1, 4 words (3, 4, 2, 5 tokens with the final stops); gold {0, 1}.
ITEM = TextItem("i", "T", ("a b.", "c d e.", "f.", "g h i j."))
TREE = build_tree(ITEM)
GOLD = GoldItem("hotpotqa", Question("q", "which?", (), (Gold("i", (0, 1)),)), TREE,
                frozenset({0, 1}))


class FakeEncoder:
    """Node vectors [s, sqrt(1 - s^2)] against the query [1, 0], so cos = s exactly."""

    def __init__(self, scores):
        self.by_text = {node_text(TREE, span): s for span, s in scores.items()}

    def encode_queries(self, texts):
        return np.tile(np.array([1.0, 0.0], np.float32), (len(texts), 1))

    def encode_nodes(self, pieces):
        s = np.array([self.by_text[p.text] for p in pieces], np.float32)
        return np.stack([s, np.sqrt(1 - s ** 2)], axis=1)


GOOD = FakeEncoder({(0, 4): .5, (0, 2): .6, (2, 4): .4, (0, 1): .55, (1, 2): .5, (2, 3): .3, (3, 4): .3})
BAD = FakeEncoder({(0, 4): .5, (0, 2): .4, (2, 4): .6, (0, 1): .3, (1, 2): .3, (2, 3): .7, (3, 4): .1})


def close(a, b):
    return math.isclose(a, b, abs_tol=1e-6)


def test_summary_matches_the_hand_worked_refinement():
    report = evaluate([GOLD], {"f0": BAD, "f_theta": GOOD})
    good = report["hotpotqa"]["f_theta"]["summary"]
    # keeps (0, 2): both preference nodes right, all gold kept, 5 of 10 words, 7 of 14 tokens
    assert (good["items"], good["pref_nodes"]) == (1, 2)
    assert close(good["decision_accuracy"], 1) and close(good["gold_recall"], 1)
    assert close(good["pruned_share"], 1) and close(good["kept_words"], .5) and close(good["kept_tokens"], .5)
    bad = report["hotpotqa"]["f0"]["summary"]
    # keeps (2, 3): the root's decision is wrong, (0, 2)'s (never visited) right; no gold kept
    assert close(bad["decision_accuracy"], .5) and close(bad["gold_recall"], 0)
    assert close(bad["kept_words"], .1) and close(bad["kept_tokens"], 2 / 14)
    assert report["all"]["f0"]["summary"] == bad


class PairScorer:
    """A scorer of (question, node) pairs (the cross-encoder's interface): the same scores as GOOD."""

    adapter_id = "cross:pairs"

    def __init__(self, encoder):
        self.by_text = encoder.by_text

    def score(self, query, texts):
        assert query == "which?"
        return np.array([self.by_text[t] for t in texts], np.float32)


def test_a_pair_scorer_is_scored_with_each_items_question():
    report = evaluate([GOLD], {"f0": BAD, "cross": PairScorer(GOOD), "f_theta": GOOD})
    assert report["hotpotqa"]["cross"] == report["hotpotqa"]["f_theta"]


def test_by_depth_limits_refinement_and_scores_are_root_relative():
    bd = evaluate([GOLD], {"f0": BAD})["hotpotqa"]["f0"]["by_depth"]
    assert sorted(bd) == [0, 1, 2]
    assert close(bd[0]["gold_recall"], 1) and close(bd[0]["kept_words"], 1) and close(bd[0]["pruned_share"], 0)
    assert close(bd[1]["gold_recall"], 0) and close(bd[1]["kept_words"], .5)
    assert close(bd[2]["kept_words"], .1)
    assert close(bd[0]["decision_accuracy"], 0) and close(bd[1]["decision_accuracy"], 1)
    assert bd[2]["decision_accuracy"] is None
    assert close(bd[1]["rel_gold"], -.1) and close(bd[1]["rel_other"], .1)
    assert truncate(TREE.root, 1).children[0].is_leaf


def test_markdown_and_plot(tmp_path):
    report = evaluate([GOLD], {"f0": BAD, "f_theta": GOOD})
    md = to_markdown(report)
    assert "| hotpotqa | f_theta | 1 | 2 | 100.0 | 100.0 | 100.0 | 50.0 | 50.0 |" in md
    png = plot_by_depth(report, tmp_path / "depth.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
