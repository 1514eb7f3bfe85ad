"""CANOPY.md section 6: an independent implementation's numbers for frozen all-MiniLM-L6-v2 on
the gold paragraphs (>= 2 sentences) of HotpotQA dev700, B = 2, node text ``title: sentences``.
This backs the "Checked against the reference" table of docs/evaluation.md."""

from pathlib import Path

import pytest

from canopy_ray.core.splits import gold_items
from canopy_ray.data.convert import convert
from canopy_ray.data.sets import load_dataset
from canopy_ray.eval.refinement import evaluate

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
DEV700 = SHARED / "hotpotqa" / "hotpotqa_distractor_dev700.jsonl"
pytestmark = [pytest.mark.integration, pytest.mark.shared_data,
              pytest.mark.skipif(not DEV700.is_file(), reason=f"needs the shared HotpotQA dev set at {DEV700}")]


def test_frozen_minilm_reproduces_the_reference_numbers(minilm, tmp_path):
    convert("hotpotqa", DEV700, tmp_path / "dev700")
    items, questions = load_dataset(tmp_path / "dev700")
    gold = list(gold_items("hotpotqa", items, questions, split=None, branching=2))
    s = evaluate(gold, {"f0": minilm})["all"]["f0"]["summary"]
    assert (s["items"], s["pref_nodes"]) == (1224, 2374)
    assert round(100 * s["decision_accuracy"], 1) == 48.4 and round(100 * s["gold_recall"], 1) == 75.6
    assert round(100 * s["pruned_share"], 1) == 71.2 and round(100 * s["kept_words"], 1) == 56.1
