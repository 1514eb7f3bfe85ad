import numpy as np
import pytest

from canopy_ray.core.lexical import scaled
from canopy_ray.eval.study import node_scores

REC = {"nodes": [[0, [0, 2]], [0, [0, 1]], [1, [0, 1]]], "tuned": [0.5, 0.4, 0.3], "bm25": [2.0, 0.0, 1.0],
       "cross": [0.9, 0.1, 0.2]}


def test_a_scorer_adds_each_named_term_by_its_weight():
    lex = scaled(REC["bm25"])
    got = node_scores(REC, "tuned+bm25:0.8+cross:0.4", 2)
    want = np.array(REC["tuned"]) + 0.8 * np.array(lex) + 0.4 * np.array(REC["cross"])
    assert [got[0][(0, 2)], got[0][(0, 1)], got[1][(0, 1)]] == pytest.approx(want.tolist())
    assert node_scores(REC, "cross", 2)[1] == {(0, 1): pytest.approx(0.2)}
    assert node_scores(REC, "tuned", 2)[0] == {(0, 2): pytest.approx(0.5), (0, 1): pytest.approx(0.4)}


def test_the_shipped_config_is_named_as_the_study_names_policies():
    from canopy_ray.config import load_config
    from canopy_ray.eval.study import POLICIES, SCORERS, shipped

    scorer, policy = shipped(load_config())
    assert (scorer, policy) == ("tuned+bm25:0.8", "lead 0.45")
    assert scorer in SCORERS and policy in POLICIES
    cfg = load_config(None, refinement={"mode": "hybrid", "share": 0.5, "lead": False, "lexical": 0.8, "cross": 0.4},
                      models={"scorer": "somewhere"})
    assert shipped(cfg) == ("tuned+bm25:0.8+cross:0.4", "hybrid 0.5")


def test_adapter_names_the_f_theta_that_scores(tmp_path, monkeypatch):
    """``--adapter`` replaces the config's f_theta (another candidate's study, in its own --work)."""
    import canopy_ray.models.encoder as encoder
    from canopy_ray.eval.study import main

    seen = []

    def stop(models):
        seen.append(models.adapter)
        raise SystemExit(0)

    monkeypatch.setattr(encoder, "build_encoder", stop)
    for argv in ([], ["--adapter", str(tmp_path)]):
        with pytest.raises(SystemExit):
            main(["--work", str(tmp_path / "work"), "--tables", *argv])
    assert seen[0] != str(tmp_path) and seen[1] == str(tmp_path)
