"""The HTTP ingress: validates requests into core types, runs the pipeline over handles.

Routes: ``POST /v1/compress``, ``POST /v1/answer``, ``POST /v1/chat/completions`` (the local
LLM, OpenAI-compatible), ``GET /healthz``, ``GET /v1/config``. Every client error is a 4xx
with ``{"error": {"reason", "message", ...}}``; nothing a request holds can stop the server.
"""


import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from ray import serve

from canopy_ray.compressor import CompressOptions
from canopy_ray.config import CanopyConfig
from canopy_ray.core.errors import ItemError
from canopy_ray.core.evidence import count_words
from canopy_ray.core.items import ImageItem, Item, VideoItem, parse_item
from canopy_ray.models.llm.protocol import ChatResult, LLMHTTPError, build_request, parse_response
from canopy_ray.models.llm.roles import arun_role
from canopy_ray.pipeline import Pipeline, Settings
from canopy_ray.serve.schemas import AnswerRequest, ApiError, CompressRequest

api = FastAPI(title="canopy-ray", description="CANOPY evidence compression and question answering")


@api.exception_handler(ApiError)
async def _api_error(request: Request, e: ApiError):
    return JSONResponse(e.body(), status_code=e.status)


@api.exception_handler(ValidationError)
@api.exception_handler(RequestValidationError)
async def _invalid(request: Request, e):
    errors = [{"field": ".".join(str(x) for x in err["loc"]) or "body", "message": err["msg"]} for err in e.errors()]
    if any(err["type"] == "json_invalid" for err in e.errors()):
        return JSONResponse({"error": {"reason": "malformed_json", "message": "the request body is not valid JSON",
                                       "errors": errors}}, status_code=400)
    return JSONResponse({"error": {"reason": "invalid_request", "message": "the request body does not match the schema",
                                   "errors": errors}}, status_code=422)


class HandleChatClient:
    """A chat client over the LLMServer deployment handle (same protocol as HTTP)."""

    def __init__(self, handle, model: str = "SmolLM2-135M-Instruct"):
        self.handle, self.model = handle, model

    async def achat(self, messages, *, response_format=None, max_tokens=None) -> ChatResult:
        t0 = time.perf_counter()
        body = build_request(self.model, messages, response_format=response_format, max_tokens=max_tokens)
        status, reply = await self.handle.chat.remote(body)
        if status != 200:
            raise LLMHTTPError(status, reply.get("error", {}).get("message", str(reply)))
        r = parse_response(reply)
        return ChatResult(r.content, r.finish_reason, r.prompt_tokens, r.completion_tokens, r.model,
                          time.perf_counter() - t0)


class ServeBackends:
    """The pipeline's :class:`~canopy_ray.pipeline.Backends` over deployment handles."""

    def __init__(self, query_encoder, retriever, refiner, chat_client):
        self.query_encoder, self.retriever, self.refiner, self.client = query_encoder, retriever, refiner, chat_client

    async def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack(await asyncio.gather(*(self.query_encoder.encode.remote(t) for t in texts)))

    async def search(self, query_vec, k):
        return await self.retriever.search.remote(query_vec, k)

    async def fetch(self, item_ids):
        return await self.retriever.fetch.remote(list(item_ids))

    async def compress(self, query_vec, items, opts: CompressOptions):
        # items of /v1/answer come from the index, so its cached node vectors apply
        return await self.refiner.compress.remote(query_vec, list(items), replace(opts, use_store=True))

    async def llm(self, call):
        return await arun_role(self.client, call)


def _check_media(item: Item, root: Path | None, index: int) -> None:
    if not isinstance(item, (ImageItem, VideoItem)):
        return
    if root is None:
        raise ApiError(422, "media_not_allowed", "image and video items need a configured serve.media_root",
                       item=index)
    path = (root / item.path).resolve()
    if not path.is_relative_to(root):
        raise ApiError(403, "path_outside_media_root", f"item {index}: media path escapes the media root",
                       item=index)


@serve.deployment
@serve.ingress(api)
class Ingress:
    """The only HTTP-facing deployment; everything else is reached through handles."""

    def __init__(self, cfg: CanopyConfig, query_encoder, refiner, retriever, llm=None):
        from canopy_ray.models.llm import client_from_config

        self.cfg = cfg
        self.query_encoder, self.refiner, self.retriever, self.llm = query_encoder, refiner, retriever, llm
        self.media_root = Path(cfg.serve.media_root).resolve() if cfg.serve.media_root else None
        self.client = HandleChatClient(llm) if llm is not None else client_from_config(cfg.llm)
        self.count_tokens = count_words
        if cfg.llm.backend == "local":  # count what the reader counts
            from canopy_ray.models.llm.local import smollm2_token_counter

            self.count_tokens = smollm2_token_counter(cfg.llm.cache_dir)
        self.settings = Settings.from_config(cfg)

    async def _body(self, request: Request) -> bytes:
        limit = self.cfg.serve.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, "body_too_large", f"the request body exceeds {limit} bytes")
        body = await request.body()
        if len(body) > limit:
            raise ApiError(413, "body_too_large", f"the request body exceeds {limit} bytes")
        return body

    def _parse_items(self, objs: list[dict]) -> list[Item]:
        lim = self.cfg.serve
        if len(objs) > lim.max_items:
            raise ApiError(413, "too_many_items", f"{len(objs)} items; at most {lim.max_items} per request")
        items = []
        for i, obj in enumerate(objs):
            if len(str(obj)) > lim.max_item_chars:
                raise ApiError(413, "item_too_large", f"item {i} exceeds {lim.max_item_chars} characters", item=i)
            try:
                item = parse_item(obj)
            except ItemError as e:
                raise ApiError(422, e.reason, f"item {i}: {e}", item=i) from None
            _check_media(item, self.media_root, i)
            items.append(item)
        ids = [it.id for it in items]
        if len(set(ids)) != len(ids):
            raise ApiError(422, "duplicate_ids", "item ids must be unique within a request")
        return items

    def _check_query(self, text: str) -> None:
        if not text.strip():
            raise ApiError(422, "empty_query", "the query is empty")
        if len(text) > self.cfg.serve.max_query_chars:
            raise ApiError(413, "query_too_long", f"the query exceeds {self.cfg.serve.max_query_chars} characters")

    @api.post("/v1/compress")
    async def compress(self, request: Request):
        req = CompressRequest.model_validate_json(await self._body(request))
        self._check_query(req.query)
        items = self._parse_items(req.items)
        t0 = time.perf_counter()
        qvec = await self.query_encoder.encode.remote(req.query)
        t1 = time.perf_counter()
        opts = CompressOptions(branching=req.branching, node_encoder=req.node_encoder)
        results = await self.refiner.compress.remote(qvec, items, opts)
        t2 = time.perf_counter()
        out = [r.to_dict(req.explain) for r in results]
        return {"items": out, "tokens_before": sum(r["tokens_before"] for r in out),
                "tokens_after": sum(r["tokens_after"] for r in out), "node_encoder": req.node_encoder,
                "timings": {"encode_query": t1 - t0, "compress": t2 - t1}}

    @api.post("/v1/answer")
    async def answer(self, request: Request):
        req = AnswerRequest.model_validate_json(await self._body(request))
        self._check_query(req.question)
        if not self.cfg.serve.index_dir:
            raise ApiError(503, "no_index", "this server has no index: set serve.index_dir and run the index job")
        backends = ServeBackends(self.query_encoder, self.retriever, self.refiner, self.client)
        pipeline = Pipeline(backends, self.settings, self.count_tokens)
        ans = await pipeline.answer(req.question, k=req.k, rounds=req.rounds, branching=req.branching, mode=req.mode)
        out = ans.to_dict()
        if req.explain:
            out["items"] = [r.to_dict(explain=True) for r in ans.results]
        return out

    @api.post("/v1/chat/completions")
    async def chat(self, request: Request):
        import json

        if self.llm is None:
            raise ApiError(404, "no_local_llm", f"the LLM is the external {self.cfg.llm.backend!r} endpoint")
        try:
            body = json.loads(await self._body(request))
        except ValueError:
            raise ApiError(400, "malformed_json", "the request body is not JSON") from None
        status, reply = await self.llm.chat.remote(body)
        return JSONResponse(reply, status_code=status)

    @api.get("/healthz")
    async def healthz(self):
        return {"status": "ok", "index": bool(self.cfg.serve.index_dir), "llm": self.cfg.llm.backend}

    @api.get("/v1/config")
    async def config(self):
        return self.cfg.model_dump() | {"index_info": await self.retriever.info.remote()}
