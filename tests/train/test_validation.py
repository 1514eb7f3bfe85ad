"""Recall-aware checkpoint choice: the validation scores equal the refinement evaluation's,
the choice rule, the learning-rate schedule and the comparison table."""

import math

import numpy as np
import pytest

from canopy_ray.eval.refinement import evaluate
from canopy_ray.train.loop import lr_factor
from canopy_ray.train.validation import (best_entry, gold_rows, qualifies, sample_gold, score_report,
                                         since_best)
from tests.eval.test_refinement_eval import BAD, GOLD, GOOD


def _vecs(encoder, texts):
    from canopy_ray.core.evidence import Piece

    return encoder.encode_nodes([Piece("", "text", (), t) for t in texts])


@pytest.mark.parametrize("enc", [GOOD, BAD])
def test_scores_equal_the_refinement_evaluation(enc):
    queries, texts, items = gold_rows([GOLD])
    got = score_report(items, _vecs(enc, texts), enc.encode_queries(queries))
    want = evaluate([GOLD], {"x": enc})["hotpotqa"]["x"]["summary"]
    for key in ("items", "decision_accuracy", "gold_recall", "pruned_share"):
        assert math.isclose(got["hotpotqa"][key], want[key]), key
    assert got["all"] == got["hotpotqa"]


def rep(acc, recall, nq_recall=0.8):
    return {"hotpotqa": {"decision_accuracy": acc, "gold_recall": recall},
            "nq": {"decision_accuracy": acc, "gold_recall": nq_recall},
            "all": {"decision_accuracy": acc, "gold_recall": (recall + nq_recall) / 2}}


def test_best_is_the_most_accurate_checkpoint_that_keeps_every_familys_recall():
    f0 = rep(.4, .7)
    curve = [{"step": 0, "report": f0},
             {"step": 50, "report": rep(.55, .72)},
             {"step": 100, "report": rep(.70, .75, nq_recall=.79)},  # NQ recall below f0's
             {"step": 150, "report": rep(.60, .70)},
             {"step": 200, "report": rep(.58, .71)}]
    best = best_entry(curve)
    assert (best["step"], best["qualifies"], best["fallback"]) == (150, True, False)
    assert not qualifies(curve[2]["report"], f0)
    assert qualifies(curve[2]["report"], f0, tolerance=0.02)
    assert best_entry(curve, tolerance=0.02)["step"] == 100
    assert since_best(curve) == 1


def test_without_a_qualifying_checkpoint_the_highest_recall_one_is_a_fallback():
    curve = [{"step": 0, "report": rep(.4, .7)},
             {"step": 50, "report": rep(.8, .5)},
             {"step": 100, "report": rep(.6, .69)}]
    best = best_entry(curve)
    assert (best["step"], best["fallback"]) == (100, True)
    assert best_entry(curve[:1]) is None  # f0 is the reference, never the choice


def test_sample_gold_is_seeded_per_family():
    from dataclasses import replace

    gold = [replace(GOLD, dataset=d) for d in ["hotpotqa"] * 5 + ["nq"] * 3]
    a = sample_gold(gold, 2, seed=1)
    assert [g.dataset for g in a].count("nq") == 2 and len(a) == 4
    assert a == sample_gold(gold, 2, seed=1)
    assert sample_gold(gold, None, seed=1) == gold


def test_lr_schedule_warms_up_then_decays_to_zero():
    assert lr_factor(0, 100, 0.1, "linear") == pytest.approx(0.1)
    assert lr_factor(9, 100, 0.1, "linear") == pytest.approx(1.0)
    assert lr_factor(10, 100, 0.1, "linear") == pytest.approx(1.0)
    assert lr_factor(55, 100, 0.1, "linear") == pytest.approx(0.5)
    assert lr_factor(99, 100, 0.1, "linear") < 0.02
    assert lr_factor(55, 100, 0.1, "cosine") == pytest.approx(0.5)
    assert lr_factor(99, 100, 0.0, "constant") == 1.0
    assert np.all(np.diff([lr_factor(s, 50, 0.2, "cosine") for s in range(10, 50)]) < 0)


def test_comparison_table_lists_f0_and_each_recipe():
    from canopy_ray.train.compare import to_markdown

    full = {f: {"decision_accuracy": .5, "gold_recall": .75} for f in ("hotpotqa", "nq", "tatqa", "all")}
    r = {"name": "lr1e-4", "steps": 100, "s_per_step": 2.9, "best_step": 75, "qualifies": True,
         "best": full, "last": full, "f0": full}
    md = to_markdown([r])
    assert "| f0 | 0 |" in md and "| lr1e-4 | 100 | 2.90 | 75 | yes | 50.0 / 75.0" in md
