"""Compose the deployment graph from a config.

The LLM by ``llm.backend``: ``local`` binds the CPU ``LLMServer`` (SmolLM2); ``vllm`` binds Ray
Serve LLM's vLLM deployment (:func:`canopy_ray.models.llm.gpu.llm_deployment`) behind
:class:`ServeLLMChat`, which answers the same ``chat``/``chat_stream``/``model`` calls as the CPU
``LLMServer``, so the ingress, the pipeline and ``/v1/chat/completions`` are the same code for
both; ``openai`` binds no model: the ingress calls ``llm.url`` over HTTP.
"""

from __future__ import annotations

import time
from typing import Any

from ray import serve

from canopy_ray.config import CanopyConfig, load_config


def build_app(args: dict[str, Any] | None = None):
    """The CANOPY Serve application.

    ``args``: ``config`` (a YAML path; default: built-in CPU defaults) plus optional
    ``index_dir``, ``media_root``, ``node_encoder`` (``serve.*``) and ``adapter`` overrides. From Python::

        from ray import serve
        from canopy_ray.serve import build_app
        serve.run(build_app({"config": "configs/cpu.yaml", "index_dir": "runs/index"}))

    From a Serve config file (``serve run configs/serve.yaml``)::

        applications:
          - name: canopy
            import_path: canopy_ray.serve:build_app
            args: {config: configs/cpu.yaml, index_dir: runs/index}
    """
    args = {k: v for k, v in (args or {}).items() if v is not None}  # YAML nulls mean "not given"
    cfg = args.pop("cfg", None) or load_config(args.pop("config", None))
    serve_over = {k: args.pop(k) for k in ("index_dir", "media_root", "node_encoder") if k in args}
    models_over = {k: args.pop(k) for k in ("adapter",) if k in args}
    if args:
        raise ValueError(f"unknown build_app args: {sorted(args)}")
    return graph(cfg.override(serve=serve_over, models=models_over))


def graph(cfg: CanopyConfig):
    from canopy_ray.serve.deployments import (LLMServer, NodeEncoder, QueryEncoder, Refiner, Retriever,
                                              ShardSearcher)
    from canopy_ray.serve.ingress import Ingress

    s = cfg.serve
    query_encoder = QueryEncoder.options(**_options(cfg, s.query_encoder_limits)).bind(cfg)
    node_encoder = None  # serve.node_encoder "refiner": the Refiner makes its own
    if s.node_encoder == "deployment":
        node_encoder = NodeEncoder.options(**_options(cfg, s.node_encoder_limits)).bind(cfg)
    refiner = Refiner.options(**_options(cfg, s.refiner_limits)).bind(cfg, node_encoder)
    searchers = None
    if s.index_dir and s.shard_replicas:  # one replica holds one shard
        from canopy_ray.index.manifest import read_manifest

        n = len(read_manifest(s.index_dir)["shards"])
        searchers = [ShardSearcher.options(name=f"ShardSearcher{i}", **_options(cfg, s.retriever_limits))
                     .bind(s.index_dir, i, cfg.retrieval.nprobe) for i in range(n)]
    retriever = Retriever.options(**_options(cfg, s.retriever_limits)).bind(s.index_dir, searchers,
                                                                            cfg.retrieval.nprobe)
    llm = None
    if cfg.llm.backend == "local":
        llm = LLMServer.options(**_options(cfg, s.llm_limits)).bind(cfg)
    elif cfg.llm.backend == "vllm":  # imports ray.serve.llm, so vLLM, only here
        from canopy_ray.models.llm.gpu import QWEN3_VL_MODEL_ID, llm_deployment

        # an async forwarder holds requests cheaply (as the ingress does); vLLM batches behind it
        llm = ServeLLMChat.options(**_options(cfg, s.chat_limits)).bind(
            cfg.llm.model or QWEN3_VL_MODEL_ID, llm_deployment(cfg.llm, s.replica_cpus))
    return Ingress.options(**_options(cfg, s.ingress_limits)).bind(cfg, query_encoder, refiner, retriever, llm)


def _options(cfg: CanopyConfig, limits: tuple[int, int]) -> dict:
    """A deployment's resources, queue bounds and health checks from ``cfg.serve``. A call past
    ``max_ongoing_requests`` on every replica waits in its caller's queue; past
    ``max_queued_requests`` too, Serve raises ``BackPressureError`` at once, which the ingress
    answers as JSON with ``Retry-After``. The Ingress's own queue is unbounded by default
    (``serve.ingress_limits``): were it bounded and full, Serve's proxy would answer
    ``overload_status`` as text/plain. A Serve config file's ``deployments:`` entry overrides these."""
    from ray.serve.config import BackpressureConfig

    s = cfg.serve
    return dict(ray_actor_options={"num_cpus": s.replica_cpus}, max_ongoing_requests=limits[0],
                max_queued_requests=limits[1], health_check_period_s=s.health_check_period_s,
                health_check_timeout_s=s.health_check_timeout_s,
                graceful_shutdown_wait_loop_s=s.graceful_shutdown_wait_loop_s,
                backpressure_config=BackpressureConfig(status_code=s.overload_status, retry_after_s=s.retry_after_s))


@serve.deployment
class ServeLLMChat:
    """The CPU ``LLMServer``'s interface over a Ray Serve LLM (vLLM) ``LLMServer`` handle.

    ``chat(body)`` returns ``(status, chat.completion dict)``; ``chat_stream(body)`` yields
    ``(status, error or None)`` then ``chat.completion.chunk`` dicts; ``model()`` is the
    ``/v1/models`` entry. Requests are OpenAI chat-completions dicts (image_url parts included)
    turned into Ray's ``ChatCompletionRequest`` for the served ``model_id``.
    """

    def __init__(self, model_id: str, llm_server):
        self.model_id, self.created = model_id, int(time.time())
        self.server = llm_server.options(stream=True)  # Ray's LLMServer.chat is a generator

    def _request(self, body: dict, stream: bool):
        from ray.serve.llm.openai_api_models import ChatCompletionRequest

        return ChatCompletionRequest(**{**body, "model": self.model_id, "stream": stream})

    async def chat(self, body: dict) -> tuple[int, dict]:
        from canopy_ray.models.llm.protocol import LLMRequestError, error_body

        try:
            request = self._request(body, False)
        except (TypeError, ValueError) as e:  # pydantic's ValidationError is a ValueError
            return 400, error_body(LLMRequestError(f"invalid chat request: {e}"[:500]))
        async for out in self.server.chat.remote(request):
            status, reply = _reply(out[0] if isinstance(out, list) else out)
            return status, reply
        return 500, error_body(LLMRequestError("the LLM returned nothing", status=500, code="server_error"))

    async def chat_stream(self, body: dict):
        import json

        from canopy_ray.models.llm.protocol import LLMRequestError, error_body

        try:
            request = self._request(body, True)
        except (TypeError, ValueError) as e:
            yield 400, error_body(LLMRequestError(f"invalid chat request: {e}"[:500]))
            return
        first = True
        async for out in self.server.chat.remote(request):
            for chunk in out if isinstance(out, list) else [out]:
                if not isinstance(chunk, str):  # an error response before any token
                    yield _reply(chunk)
                    return
                if first:
                    yield 200, None
                    first = False
                for line in chunk.splitlines():  # "data: {...}" server-sent events
                    data = line[len("data: "):].strip() if line.startswith("data: ") else ""
                    if data and data != "[DONE]":
                        yield json.loads(data)

    def model(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "canopy-ray"}


def _reply(out) -> tuple[int, dict]:
    """(status, body) of a Ray Serve LLM chat response or ``ErrorResponse``."""
    body = out.model_dump() if hasattr(out, "model_dump") else dict(out)
    error = body.get("error")
    if isinstance(error, dict):
        return int(error.get("code") or 500), {"error": {k: error.get(k) for k in ("message", "type", "param", "code")}}
    return 200, body
