"""LLM roles and backends, all behind the OpenAI chat-completions protocol.

- :mod:`.roles`: critic, reader, table classifier, modality router (prompts, JSON schemas,
  parsing, graceful degradation); ``run_role(client, critic_call(q, evidence))``.
- :mod:`.protocol`: the request/response shape, validation and typed errors.
- :mod:`.http`: :class:`OpenAIHTTPClient` for any OpenAI-compatible endpoint by URL.
- :mod:`.local`: SmolLM2-135M-Instruct in-process with xgrammar (the CPU default), the
  ``/v1/chat/completions`` handler and :class:`LocalChatClient`.
- :mod:`.vl_local`: a Qwen3-VL generation checkpoint in-process (``local-vl``), reading image parts.
- :mod:`.gpu`: the ``ray.serve.llm`` ``LLMConfig`` and deployment for Qwen3-VL-8B-Instruct on vLLM.
- :mod:`.vision`: kept images and video frames as labelled data-URI pictures for a multimodal
  critic and reader (``llm.multimodal``), read only under ``serve.media_root``.

torch/transformers/xgrammar load only when :mod:`.local` is used; vLLM only in :mod:`.gpu`.
"""

from __future__ import annotations

from canopy_ray.models.llm.protocol import (ChatClient, ChatResult, LLMConnectionError, LLMError, LLMHTTPError,
                                            LLMRequestError, LLMResponseError, LLMTimeoutError, error_body,
                                            json_schema_format)
from canopy_ray.models.llm.roles import (MODALITIES, Critique, Outcome, RoleCall, arun_role, critic_call,
                                         reader_call, router_call, run_role, table_call)


def make_client(backend: str = "local", *, url: str | None = None, model: str | None = None,
                max_new_tokens: int = 64, timeout: float = 120.0, cache_dir: str | None = None,
                threads: int | None = None, model_dir: str | None = None, device: str = "cpu") -> ChatClient:
    """A client from config values: ``local`` (in-process SmolLM2), ``local-vl`` (in-process
    Qwen3-VL from ``model_dir``), or ``openai``/``vllm`` (HTTP to
    ``url``, e.g. a Ray Serve LLM app at ``http://127.0.0.1:8000/v1`` serving ``model``)."""
    if backend == "local":
        from canopy_ray.models.llm.local import LocalChatClient, SmolLM2Backend

        return LocalChatClient(SmolLM2Backend(cache_dir=cache_dir, max_new_tokens=max_new_tokens, threads=threads))
    if backend in ("openai", "vllm"):
        if not url:
            raise ValueError(f"the {backend!r} LLM backend needs a url")
        if not model and backend == "vllm":
            from canopy_ray.models.llm.gpu import QWEN3_VL_MODEL_ID

            model = QWEN3_VL_MODEL_ID
        if not model:
            raise ValueError("the 'openai' LLM backend needs the served model's name")
        from canopy_ray.models.llm.http import OpenAIHTTPClient

        return OpenAIHTTPClient(url, model, timeout=timeout)
    if backend == "local-vl":
        if not model_dir:
            raise ValueError("the 'local-vl' LLM backend needs llm.model_dir (a Qwen3-VL Instruct folder)")
        from canopy_ray.models.llm.vl_local import QwenVLBackend, VLChatClient

        return VLChatClient(QwenVLBackend(model_dir, device=device, max_new_tokens=max_new_tokens, threads=threads,
                                          model_name=model))
    raise ValueError(f"unknown LLM backend {backend!r}: expected local, local-vl, openai or vllm")


def client_from_config(llm_cfg) -> ChatClient:
    """The chat client a config's ``llm`` section describes."""
    return make_client(llm_cfg.backend, url=llm_cfg.url, model=llm_cfg.model, max_new_tokens=llm_cfg.max_new_tokens,
                       timeout=llm_cfg.timeout_s, cache_dir=llm_cfg.cache_dir, threads=llm_cfg.threads,
                       model_dir=llm_cfg.model_dir, device=llm_cfg.device or "cpu")


__all__ = [
    "ChatClient", "ChatResult", "Critique", "LLMConnectionError", "LLMError", "LLMHTTPError", "LLMRequestError",
    "LLMResponseError", "LLMTimeoutError", "MODALITIES", "Outcome", "RoleCall", "arun_role", "critic_call",
    "error_body", "json_schema_format", "make_client", "client_from_config", "reader_call", "router_call", "run_role", "table_call",
]
