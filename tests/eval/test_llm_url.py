"""``--llm-url`` on ``canopy eval`` and ``canopy sweep``: reader and critic go to an
OpenAI-compatible server (a real HTTP server on 127.0.0.1 answering like the scripted client)."""

import json

import pytest

from tests.eval.conftest import CORPUS, QUESTIONS
from tests.eval.scripted import ScriptedClient
from tests.openai_stub import chat_handler, serving


CALLS: list = []


@pytest.fixture
def served():
    CALLS.clear()
    with serving(chat_handler(lambda req: ScriptedClient()._reply(req["messages"], req["response_format"]),
                              CALLS)) as url:
        yield url


@pytest.mark.integration
def test_eval_sends_reader_and_critic_to_the_llm_url(served, tmp_path):
    from canopy_ray.cli import main

    rc = main(["eval", "--questions", str(QUESTIONS), "--corpus", str(CORPUS), "--method", "shipped,random", "--k", "2",
               "--n", "2", "--llm-url", served, "--policy", "canopy margin=0.02", "--out", str(tmp_path / "ev")])
    assert rc == 0
    roles = {req["response_format"]["json_schema"]["name"] for _, req in CALLS}
    assert {"canopy_reader", "canopy_critic"} <= roles
    assert {(path, req["model"]) for path, req in CALLS} == {("/v1/chat/completions", "served-model")}
    for method in ("shipped", "random"):
        run = json.loads((tmp_path / "ev" / f"eval_{method}.json").read_text())
        assert run["spec"]["llm_model"] == "served-model" and run["errors"] == 0
        # --policy replaced the config's: shipped ran it, random replayed that run
        assert run["spec"]["policy"] == run["spec"]["refinement"]["policy"] == "canopy margin=0.02"
        assert all(r["prediction"] in ("Tulsa", "Arkansas River", "Somerset", "unknown") for r in run["records"])


def test_llm_model_without_llm_url_is_a_usage_error(capsys):
    from canopy_ray.eval.sweep import main as sweep_main
    from canopy_ray.evaluator import main as eval_main

    assert eval_main(["--questions", str(QUESTIONS), "--llm-model", "m", "--out", "x"]) == 2
    assert sweep_main(["--llm-model", "m"]) == 2
    assert "--llm-url" in capsys.readouterr().err
