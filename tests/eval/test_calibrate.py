"""``canopy calibrate``: the margin with the fewest tokens within the recall target, written where
the policy ``canopy margin=auto`` reads it."""

import json
import shutil

import pytest

from canopy_ray.config import load_config
from canopy_ray.core.policy import Policy
from canopy_ray.eval.calibrate import calibrate, choose
from tests.eval.conftest import CORPUS, QUESTIONS
from tests.eval.scripted import ScriptedClient


def _curve(deltas, tokens):
    return {"points": [{"margin": m, "tokens": t, "delta": {"mean": d}}
                       for m, d, t in zip((0.0, 0.01, 0.02, 0.05), deltas, tokens)]}


def test_choose_takes_the_fewest_tokens_within_the_target_on_every_set():
    curves = {"a": _curve([-0.05, -0.008, 0.0, 0.0], [50, 60, 70, 90]),
              "b": _curve([-0.02, -0.02, -0.005, 0.0], [40, 45, 55, 80])}
    assert choose(curves, 0.01) == 0.02  # 0.01 passes on a, fails on b
    assert choose(curves, 0.03) == 0.01 and choose(curves, 0.06) == 0.0
    never = {"a": _curve([-0.5, -0.4, -0.3, -0.2], [1, 2, 3, 4])}
    assert choose(never, 0.01) == 0.05  # nothing qualifies: the largest margin of the grid


@pytest.mark.integration
def test_calibration_runs_each_margin_and_auto_reads_the_choice(tmp_path):
    data = tmp_path / "tiny"
    data.mkdir()
    shutil.copy(QUESTIONS, data / "questions.jsonl")
    shutil.copy(CORPUS, data / "corpus.jsonl")
    adapter = tmp_path / "adapter"
    shutil.copytree(load_config().models.adapter, adapter)
    cfg = load_config(models={"adapter": str(adapter)})  # the shipped hybrid: the curves run Algorithm 1 whatever
    assert cfg.policy.kind == "hybrid"
    result = calibrate(cfg, {"tiny": data}, 0.01, adapter, grid=(0.0, 0.5), client=ScriptedClient(),
                       split=None, progress=None)
    points = result["curves"]["tiny"]["points"]
    # a margin of 0.5 splits nothing: every item is kept whole, as no_projection keeps it
    assert points[1]["tokens"] == pytest.approx(result["curves"]["tiny"]["no_projection"]["tokens"])
    assert points[0]["tokens"] < points[1]["tokens"]
    assert result["margin"] in (0.0, 0.5) and result["curves"]["tiny"]["n"] == 3
    saved = json.loads((adapter / "calibration.json").read_text())
    assert saved["margin"] == result["margin"]
    auto = load_config(models={"adapter": str(adapter)}, refinement={"policy": "canopy margin=auto"})
    assert auto.refinement.policy == "canopy margin=auto"
    assert auto.margin == result["margin"] and auto.policy == Policy("canopy", margin=result["margin"])
    assert (adapter / "calibration.png").read_bytes()[:4] == b"\x89PNG"
    assert "| 0.5" in (adapter / "calibration.md").read_text()
