"""The HTTP ingress: validates requests into core types, runs the pipeline over handles.

Routes: ``POST /v1/compress``, ``POST /v1/answer``, ``GET /healthz``, ``GET /v1/config``, and
the OpenAI ones for the local LLM: ``POST /v1/chat/completions`` (``stream`` answers with
server-sent ``chat.completion.chunk`` events, token by token, then ``data: [DONE]``) and
``GET /v1/models`` (``/v1/models/{id}``). A client error on the CANOPY routes is a 4xx with
``{"error": {"reason", "message", ...}}``; on the OpenAI routes it has OpenAI's shape,
``{"error": {"message", "type", "code", "param"}}``. Nothing a request holds can stop the server.

Faults (README "Failure behaviour"): past ``serve.max_inflight`` CANOPY requests in progress, a
new one is shed at once (503, or 429, ``overloaded``, with ``Retry-After``), before any work,
so that accepted requests keep their latency (the Ingress's own Serve queue is unbounded, so
this bound, not Serve's proxy, answers every overload); every call to another deployment goes
through :meth:`Ingress._call`, bounded by ``serve.call_timeout_s``; a replica that died under a call
(``RayActorError``) is retried ``serve.retries`` times for idempotent calls (encode, search,
fetch, compress: Serve routes the retry to a live replica, or waits for the restarted one), then
answered 503 ``replica_failed``; a full queue (``BackPressureError``) is 503 (or 429)
``overloaded``; both with ``Retry-After``. A request past ``serve.request_timeout_s`` is 504
``timeout``; any other exception on a CANOPY route is a JSON 500 ``internal_error``. The LLM
roles degrade instead (:func:`~canopy_ray.models.llm.roles.arun_role`): /v1/answer returns its
evidence with ``answer: null`` and ``answer_error`` when the reader could not answer.
"""


import asyncio
import json
import logging
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from ray import serve
from ray.exceptions import (NodeDiedError, ObjectLostError, RayActorError, RaySystemError, RayTaskError,
                            TaskCancelledError, WorkerCrashedError)
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError

from canopy_ray.compressor import CompressOptions
from canopy_ray.config import CanopyConfig
from canopy_ray.core.errors import ItemError
from canopy_ray.core.files import under_root
from canopy_ray.core.items import ImageItem, Item, VideoItem, parse_item
from canopy_ray.core.policy import Policy
from canopy_ray.models.llm.protocol import (ChatResult, LLMConnectionError, LLMHTTPError, LLMRequestError,
                                            LLMTimeoutError, build_request, error_body, parse_response)
from canopy_ray.models.llm.roles import arun_role
from canopy_ray.models.llm.tokens import token_counter
from canopy_ray.pipeline import Pipeline, Settings
from canopy_ray.serve.metrics import record_error, record_request, record_result
from canopy_ray.serve.schemas import AnswerRequest, ApiError, CompressRequest

log = logging.getLogger("ray.serve")
api = FastAPI(title="canopy-ray", description="CANOPY evidence compression and question answering")


@api.middleware("http")
async def _measure(request: Request, call_next):
    """Every request counted by route and status, and timed (:mod:`canopy_ray.serve.metrics`)."""
    t0 = time.perf_counter()
    try:
        response = await call_next(request)
    except Exception:  # answered by the JSON 500 handler, outside this middleware
        record_request(request.url.path, 500, time.perf_counter() - t0)
        raise
    record_request(request.url.path, response.status_code, time.perf_counter() - t0)
    return response


@api.exception_handler(ApiError)
async def _api_error(request: Request, e: ApiError):
    record_error(request.url.path, e.reason)
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


@api.exception_handler(Exception)
async def _unexpected(request: Request, e: Exception):
    """Whatever escaped a route (a bug): a JSON 500 that names the exception's type, never
    Starlette's plain-text page; the traceback goes to the replica's log."""
    log.error("unexpected %s on %s %s", type(e).__name__, request.method, request.url.path, exc_info=e)
    record_error(request.url.path, "internal_error")
    return JSONResponse({"error": {"reason": "internal_error",
                                   "message": f"the server failed: {type(e).__name__}"}}, status_code=500)


@api.exception_handler(ValidationError)
@api.exception_handler(RequestValidationError)
async def _invalid(request: Request, e):
    errors = [{"field": ".".join(str(x) for x in err["loc"]) or "body", "message": err["msg"]} for err in e.errors()]
    if any(err["type"] == "json_invalid" for err in e.errors()):
        record_error(request.url.path, "malformed_json")
        return JSONResponse({"error": {"reason": "malformed_json", "message": "the request body is not valid JSON",
                                       "errors": errors}}, status_code=400)
    record_error(request.url.path, "invalid_request")
    return JSONResponse({"error": {"reason": "invalid_request", "message": "the request body does not match the schema",
                                   "errors": errors}}, status_code=422)


# ---------------------------------------------------------------- faults of other deployments

_REPLICA_FAULTS = (RayActorError, ReplicaUnavailableError, WorkerCrashedError, ObjectLostError, NodeDiedError,
                   RaySystemError)


def _chain(e: BaseException) -> list[BaseException]:
    """``e`` and what it wraps: a replica's exception reaches the caller as a ``RayTaskError``
    whose ``cause`` is the original (a Refiner's call to a dead NodeEncoder: ActorDiedError)."""
    out: list[BaseException] = []
    while e is not None and len(out) < 8 and all(e is not x for x in out):
        out.append(e)
        e = getattr(e, "cause", None) if isinstance(e, RayTaskError) else e.__cause__
    return out


def retry_after(seconds: float) -> dict[str, str]:
    """The ``Retry-After`` header (whole seconds, at least 1)."""
    return {"Retry-After": str(max(1, round(seconds)))}


def fault_error(stage: str, e: Exception, retry_after_s: float, overload_status: int = 503) -> ApiError:
    """The JSON answer for a failed call to another deployment; ``.retryable`` marks a replica
    that died (the call may be repeated on a live one). An exception that is not a Serve or Ray
    fault is re-raised (it is a bug: the route's handler answers a JSON 500)."""
    from canopy_ray.core.errors import ItemError

    chain = _chain(e)
    retry = retry_after(retry_after_s)

    def first(types):
        return next((x for x in chain if isinstance(x, types)), None)

    if (x := first(BackPressureError)) is not None:
        err = ApiError(overload_status, "overloaded", f"the server is at capacity ({stage}): retry later; {x}",
                       headers=retry, stage=stage)
    elif (x := first(DeploymentUnavailableError)) is not None:
        err = ApiError(503, "unavailable", f"{stage}: {x.message}", headers=retry, stage=stage)
    elif (x := first(_REPLICA_FAULTS)) is not None:
        err = ApiError(503, "replica_failed", f"a replica failed during {stage} ({type(x).__name__}); Serve "
                                              "restarts it: retry", headers=retry, stage=stage)
    elif (x := first(ItemError)) is not None:  # an item that validated here but failed to load there
        err = ApiError(422, x.reason, f"{stage}: {x}", stage=stage)
    elif (x := first(TaskCancelledError)) is not None:
        err = ApiError(503, "cancelled", f"{stage} was cancelled", headers=retry, stage=stage)
    elif isinstance(e, TimeoutError):
        err = ApiError(504, "timeout", f"{stage} did not finish in time", stage=stage)
    elif isinstance(e, RayTaskError):  # the replica's own code raised
        cause = chain[-1]
        err = ApiError(500, "internal_error", f"{stage} failed: {type(cause).__name__}", stage=stage)
    else:
        raise e
    err.retryable = err.reason == "replica_failed"
    return err


class HandleChatClient:
    """A chat client over the LLMServer deployment handle (same protocol as HTTP). A replica
    that died, a full queue or ``timeout`` raise :class:`~canopy_ray.models.llm.protocol.LLMError`
    subclasses, which the roles count and degrade on."""

    def __init__(self, handle, model: str = "SmolLM2-135M-Instruct", timeout: float = 120.0):
        self.handle, self.model, self.timeout = handle, model, timeout

    async def achat(self, messages, *, response_format=None, max_tokens=None) -> ChatResult:
        t0 = time.perf_counter()
        body = build_request(self.model, messages, response_format=response_format, max_tokens=max_tokens)
        try:
            status, reply = await asyncio.wait_for(_await(self.handle.chat.remote(body)), self.timeout)
        except TimeoutError:
            raise LLMTimeoutError(f"LLMServer: no reply in {self.timeout} s") from None
        except Exception as e:
            err = fault_error("llm", e, 0)
            if err.reason == "replica_failed":
                raise LLMConnectionError(f"LLMServer: {err.message}") from None
            raise LLMHTTPError(err.status, err.message, "LLMServer") from None
        if status != 200:
            raise LLMHTTPError(status, reply.get("error", {}).get("message", str(reply)))
        r = parse_response(reply)
        return ChatResult(r.content, r.finish_reason, r.prompt_tokens, r.completion_tokens, r.model,
                          time.perf_counter() - t0)


async def _await(response):
    return await response


Call = Callable[[str, Callable[[], Any]], Awaitable[Any]]


class ServeBackends:
    """The pipeline's :class:`~canopy_ray.pipeline.Backends` over deployment handles; ``call``
    (:meth:`Ingress._call`) bounds, retries and maps the faults of each handle call."""

    def __init__(self, query_encoder, retriever, refiner, chat_client, call: Call):
        self.query_encoder, self.retriever, self.refiner, self.client = query_encoder, retriever, refiner, chat_client
        self.call = call

    async def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack(await asyncio.gather(*(self.call("encode", lambda t=t: self.query_encoder.encode.remote(t))
                                               for t in texts)))

    async def search(self, query_vec, k, modalities=None):
        return await self.call("search", lambda: self.retriever.search.remote(query_vec, k, modalities))

    async def fetch(self, item_ids):
        return await self.call("fetch", lambda: self.retriever.fetch.remote(list(item_ids)))

    async def compress(self, query_vec, items, opts: CompressOptions):
        # items of /v1/answer come from the index, so its cached node vectors apply
        opts = replace(opts, use_store=True)
        return await self.call("compress", lambda: self.refiner.compress.remote(query_vec, list(items), opts))

    async def llm(self, call):
        return await arun_role(self.client, call)


def _openai_error(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    """An error on the OpenAI routes, in OpenAI's shape."""
    return JSONResponse(error_body(LLMRequestError(message, status=status, code=code, param=param)), status)


def _openai_fault(e: Exception, s) -> JSONResponse:
    """A failed LLMServer call on the OpenAI routes: a full queue is ``overload_status`` with
    ``Retry-After``, a dead replica 503, anything else 500; OpenAI's error shape."""
    try:
        err = fault_error("generation", e, s.retry_after_s, s.overload_status)
    except Exception:
        return _openai_error(500, f"generation failed: {type(e).__name__}", "server_error")
    code = {"overloaded": "overloaded", "replica_failed": "server_unavailable"}.get(err.reason, "server_error")
    resp = _openai_error(err.status, err.message, code)
    resp.headers.update(err.headers)
    return resp


def _sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _check_media(item: Item, root: Path | None, index: int) -> None:
    if not isinstance(item, (ImageItem, VideoItem)):
        return
    if root is None:
        raise ApiError(422, "media_not_allowed", "image and video items need a configured serve.media_root",
                       item=index)
    if under_root(root, item.path) is None:
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
        self.client = HandleChatClient(llm, timeout=cfg.llm.timeout_s) if llm is not None else client_from_config(cfg.llm)
        self.llm_stream = llm.options(stream=True) if llm is not None else None
        self._model_card: dict | None = None
        self.count_tokens = token_counter(cfg.llm)  # count what the reader counts
        self.settings = Settings.from_config(cfg)
        self.faults: Counter = Counter()  # what _call met: retries, and the faults it answered
        self.inflight = 0  # CANOPY requests in progress here (one event loop: a plain counter)

    def _overloaded(self, what: str) -> ApiError:
        s = self.cfg.serve
        self.faults["overloaded"] += 1
        return ApiError(s.overload_status, "overloaded", f"the server is at capacity ({s.max_inflight} requests in "
                        f"progress): retry {what} later", headers=retry_after(s.retry_after_s))

    async def _admitted(self, request: Request, work, what: str):
        """``work(body)`` if fewer than ``serve.max_inflight`` requests are in progress, else
        an immediate :class:`ApiError` ``overloaded`` (the body is not even read)."""
        if self.inflight >= self.cfg.serve.max_inflight:
            raise self._overloaded(what)
        self.inflight += 1
        try:
            return await work(await self._body(request))
        finally:
            self.inflight -= 1

    async def _call(self, stage: str, make: Callable[[], Any], idempotent: bool = True):
        """``await make()`` (a handle call) within ``serve.call_timeout_s``; a call whose replica
        died is made again (idempotent calls, ``serve.retries`` times); every fault becomes an
        :class:`ApiError` with a reason (:func:`fault_error`)."""
        s = self.cfg.serve
        for attempt in range(1 + (s.retries if idempotent else 0)):
            try:
                return await asyncio.wait_for(_await(make()), s.call_timeout_s)
            except Exception as e:
                err = fault_error(stage, e, s.retry_after_s, s.overload_status)
                if err.retryable and attempt < s.retries and idempotent:
                    self.faults[f"retried_{stage}"] += 1
                    log.warning("%s: %s; retrying", stage, err.message)
                    continue
                self.faults[err.reason] += 1
                raise err from None

    async def _deadline(self, coro, what: str):
        """``coro`` within ``serve.request_timeout_s``, else 504 ``timeout``."""
        try:
            return await asyncio.wait_for(coro, self.cfg.serve.request_timeout_s)
        except TimeoutError:
            self.faults["timeout"] += 1
            raise ApiError(504, "timeout", f"{what} did not finish in {self.cfg.serve.request_timeout_s} s "
                                           "(serve.request_timeout_s)") from None

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

    def _policy(self, req) -> Policy:
        """The request's policy, else the server's; a cross term needs the server's cross-encoder."""
        policy = req.policy or self.settings.policy
        if policy.terms.cross and not self.cfg.models.scorer:
            raise ApiError(422, "no_cross_encoder", "the policy's cross term needs a cross-encoder: this server "
                                                    "has no models.scorer")
        return policy

    @api.post("/v1/compress")
    async def compress(self, request: Request):
        out = await self._admitted(request, self._compress_body, "the compression")
        record_result("/v1/compress", out["tokens_before"], out["tokens_after"], out["timings"])
        return out

    async def _compress_body(self, body: bytes) -> dict:
        req = CompressRequest.model_validate_json(body)
        self._check_query(req.query)
        items = self._parse_items(req.items)
        return await self._deadline(self._compress(req, items), "the compression")

    async def _compress(self, req: CompressRequest, items: list[Item]) -> dict:
        policy = self._policy(req)
        opts = CompressOptions(policy=policy, branching=req.branching, node_encoder=req.node_encoder, query=req.query)
        t0 = time.perf_counter()
        if self.cfg.serve.node_encoder == "refiner":  # one call: the Refiner encodes the query too
            results, encoded = await self._call("compress", lambda: self.refiner.compress_query.remote(
                req.query, items, opts))
            t1 = t0 + encoded
        else:
            qvec = await self._call("encode", lambda: self.query_encoder.encode.remote(req.query))
            t1 = time.perf_counter()
            results = await self._call("compress", lambda: self.refiner.compress.remote(qvec, items, opts))
        t2 = time.perf_counter()
        out = [r.to_dict(req.explain) for r in results]
        totals = {k: sum(r[k] for r in out) for k in ("tokens_before", "tokens_after", "nodes_total",
                                                      "nodes_scored", "nodes_encoded", "encoded_tokens")}
        return {"items": out, **totals, "node_encoder": req.node_encoder, "policy": str(policy),
                "timings": {"encode_query": t1 - t0, "compress": t2 - t1}}

    @api.post("/v1/answer")
    async def answer(self, request: Request):
        out = await self._admitted(request, self._answer_body, "the answer")
        record_result("/v1/answer", out["tokens"].get("before", 0), out["tokens"].get("after", 0), out["timings"])
        return out

    async def _answer_body(self, body: bytes) -> dict:
        req = AnswerRequest.model_validate_json(body)
        self._check_query(req.question)
        if not self.cfg.serve.index_dir:
            raise ApiError(503, "no_index", "this server has no index: set serve.index_dir and run the index job")
        backends = ServeBackends(self.query_encoder, self.retriever, self.refiner, self.client, self._call)
        pipeline = Pipeline(backends, self.settings, self.count_tokens)
        policy = self._policy(req)
        ans = await self._deadline(pipeline.answer(req.question, k=req.k, rounds=req.rounds, branching=req.branching,
                                                   policy=policy), "the answer")
        out = ans.to_dict() | {"policy": str(policy)}
        if req.explain:
            out["items"] = [r.to_dict(explain=True) for r in ans.results]
        return out

    # ---------------------------------------------------------------- OpenAI routes

    @api.post("/v1/chat/completions")
    async def chat(self, request: Request):
        if self.llm is None:
            return _openai_error(404, f"this server runs no model: the LLM is the external "
                                      f"{self.cfg.llm.backend!r} endpoint", "no_local_llm")
        try:
            body = json.loads(await self._body(request))
        except ApiError as e:
            return _openai_error(e.status, e.message, e.reason)
        except ValueError:
            return _openai_error(400, "the request body is not valid JSON", "malformed_json")
        try:
            if isinstance(body, dict) and body.get("stream") is True:
                return await self._chat_stream(body)
            status, reply = await self.llm.chat.remote(body)
        except Exception as e:  # the model failed, not the request
            log.exception("chat completion failed")
            return _openai_fault(e, self.cfg.serve)
        return JSONResponse(reply, status_code=status)

    async def _chat_stream(self, body: dict):
        """Server-sent events as LLMServer decodes; a request error comes first, as plain JSON."""
        chunks = self.llm_stream.chat_stream.remote(body)
        status, error = await chunks.__anext__()
        if status != 200:
            return JSONResponse(error, status_code=status)

        async def events():
            try:
                async for chunk in chunks:
                    yield _sse(chunk)
            except Exception as e:  # the status line is sent: report in the stream, as vLLM does
                log.exception("streamed chat completion failed")
                yield _sse(error_body(LLMRequestError(f"generation failed: {type(e).__name__}", status=500,
                                                      code="server_error")))
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def _models(self) -> list[dict]:
        if self.llm is None:
            return []
        if self._model_card is None:
            self._model_card = await self.llm.model.remote()
        return [self._model_card]

    @api.get("/v1/models")
    async def models(self):
        return {"object": "list", "data": await self._models()}

    @api.get("/v1/models/{model_id:path}")
    async def model(self, model_id: str):
        for card in await self._models():
            if card["id"] == model_id:
                return card
        return _openai_error(404, f"the model {model_id!r} does not exist", "model_not_found", "model")

    @api.get("/healthz")
    async def healthz(self):
        return {"status": "ok", "index": bool(self.cfg.serve.index_dir), "llm": self.cfg.llm.backend}

    @api.get("/v1/config")
    async def config(self):
        return self.cfg.model_dump() | {"index_info": await self._call("info", lambda: self.retriever.info.remote()),
                                        "compression": await self._call("stats", lambda: self.refiner.stats.remote()),
                                        "faults": dict(self.faults)}
