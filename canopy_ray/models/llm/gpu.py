"""The GPU LLM: Qwen3-VL-8B-Instruct on vLLM, deployed with Ray Serve LLM (``ray.serve.llm``).

Importing ``ray.serve.llm`` requires vLLM, so this module imports it only inside
:func:`qwen3_vl_llm_config`; :func:`qwen3_vl_llm_config_dict` is plain data (also what a Serve
YAML's ``llm_configs`` entry holds) and is what CPU tests check.

Python::

    from ray import serve
    from ray.serve.llm import build_openai_app
    from canopy_ray.models.llm.gpu import qwen3_vl_llm_config

    serve.run(build_openai_app({"llm_configs": [qwen3_vl_llm_config()]}), blocking=False)
    # then: OpenAIHTTPClient("http://127.0.0.1:8000/v1", model="qwen3-vl-8b-instruct")

Serve YAML::

    applications:
      - name: llm
        route_prefix: /
        import_path: ray.serve.llm:build_openai_app
        args:
          llm_configs:
            - <the dict from qwen3_vl_llm_config_dict()>

Structured outputs: vLLM honours ``response_format={"type": "json_schema", ...}`` with its
default structured-output backend, xgrammar, the same library as the CPU backend.
"""

from __future__ import annotations

from typing import Any

QWEN3_VL_8B = "Qwen/Qwen3-VL-8B-Instruct"
QWEN3_VL_MODEL_ID = "qwen3-vl-8b-instruct"


def qwen3_vl_llm_config_dict(*, model_source: str = QWEN3_VL_8B, model_id: str = QWEN3_VL_MODEL_ID,
                             accelerator_type: str | None = "H100", tensor_parallel_size: int = 1,
                             max_model_len: int = 81920, gpu_memory_utilization: float = 0.90,
                             max_images_per_prompt: int = 64, min_replicas: int = 1, max_replicas: int = 1,
                             target_ongoing_requests: int = 32,
                             engine_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``LLMConfig`` fields as a plain dict.

    Sizes: 8B parameters in bf16 are about 17 GB; Qwen3-VL-8B's KV cache is about 144 KiB per
    token (36 layers x 8 KV heads x 128 dims x 2 x bf16), so an 80k-token context is ~11 GiB:
    one 80 GB GPU per replica holds both. ``max_model_len`` 81920 covers the paper's 64k-token
    reader cap for long video plus the prompt; text benchmarks cap evidence at 16k.
    ``enable_prefix_caching`` pays off because the critic re-reads growing evidence whose
    beginning is unchanged between rounds. ``max_images_per_prompt`` bounds the frames of kept
    video segments plus images sent in one request (CANOPY sends video as frames).
    ``model_source`` may be a local folder to avoid a hub download.
    """
    kwargs: dict[str, Any] = {
        "tensor_parallel_size": tensor_parallel_size,
        "max_model_len": max_model_len,
        "gpu_memory_utilization": gpu_memory_utilization,
        "dtype": "bfloat16",
        "enable_prefix_caching": True,
        "limit_mm_per_prompt": {"image": max_images_per_prompt, "video": 0},
    }
    kwargs.update(engine_kwargs or {})
    config: dict[str, Any] = {
        "model_loading_config": {"model_id": model_id, "model_source": model_source},
        "engine_kwargs": kwargs,
        "deployment_config": {
            "autoscaling_config": {"min_replicas": min_replicas, "max_replicas": max_replicas,
                                   "target_ongoing_requests": target_ongoing_requests},
            "max_ongoing_requests": 4 * target_ongoing_requests,
        },
    }
    if accelerator_type:
        config["accelerator_type"] = accelerator_type
    return config


def qwen3_vl_llm_config(**kwargs: Any):
    """A ``ray.serve.llm.LLMConfig`` (needs vLLM installed: ``pip install 'canopy-ray[gpu]'``)."""
    try:
        from ray.serve.llm import LLMConfig
    except ImportError as e:
        raise RuntimeError(f"the GPU LLM needs vLLM for ray.serve.llm ({e}); install canopy-ray[gpu]") from e
    return LLMConfig(**qwen3_vl_llm_config_dict(**kwargs))
