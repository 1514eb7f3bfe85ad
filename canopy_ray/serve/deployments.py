"""The Serve deployments behind the ingress: one model or data structure each.

QueryEncoder (f0, batched), NodeEncoder (f_theta or f0 over node pieces, batched),
Retriever (FAISS search and item fetch, optionally fanning out to one ShardSearcher per
shard), Refiner (trees, cached node vectors, refinement; with ``serve.node_encoder: refiner``
it holds the NodeEncoder's models itself) and LLMServer (the local CPU model behind the
chat-completions protocol).

The model deployments define ``check_health`` (Serve calls it every
``serve.health_check_period_s``; raising marks the replica unhealthy and Serve replaces it): a
forward pass that raised, or a replica idle for a period, is checked with a tiny forward pass
(:class:`ModelHealth`), so a broken model is noticed before users meet it. A replica that
dies outright (SIGKILL, OOM) is restarted by Serve without any check.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import itertools
import time
from typing import Callable, Sequence

import numpy as np
from ray import serve

from canopy_ray.compressor import CompressOptions, Compressor, ItemResult
from canopy_ray.config import CanopyConfig
from canopy_ray.core.evidence import Piece
from canopy_ray.core.items import Item


class ModelHealth:
    """What ``check_health`` knows of one model: when a real forward pass last succeeded and
    the last one that raised. :meth:`check` runs ``probe`` (a tiny forward pass) when a pass
    raised since, or none succeeded within ``idle_s``; a passing probe clears the failure (it
    was the request's, not the model's), a failing one raises, and Serve restarts the replica."""

    def __init__(self, probe: Callable[[], object], idle_s: float):
        self.probe, self.idle_s = probe, idle_s
        self.error: str | None = None
        self.last_ok = time.monotonic()

    def ok(self) -> None:
        self.last_ok = time.monotonic()

    def failed(self, e: BaseException) -> None:
        self.error = f"{type(e).__name__}: {e}"[:300]

    def run(self, forward: Callable[[], object]):
        """``forward()``, recording its success or failure."""
        try:
            out = forward()
        except Exception as e:
            self.failed(e)
            raise
        self.ok()
        return out

    def due(self) -> bool:
        return self.error is not None or time.monotonic() - self.last_ok > self.idle_s

    def check(self) -> None:
        if not self.due():
            return
        try:
            self.probe()
        except Exception as e:
            raise RuntimeError(f"the model's health probe failed ({type(e).__name__}: {e}); last request "
                               f"failure: {self.error or 'none'}") from e
        self.error = None
        self.ok()


def encoder_threads(n: int | None) -> int:
    """Sets torch's threads for an encoder replica: ``models.threads``, or every CPU of the node,
    since the encoders are the compress path's one heavy computation."""
    import os

    import torch

    torch.set_num_threads(n or len(os.sched_getaffinity(0)))
    return torch.get_num_threads()


@serve.deployment
class QueryEncoder:
    """f0 over query strings; concurrent requests are batched with ``@serve.batch``, and a
    small vector cache answers a query seen before."""

    def __init__(self, cfg: CanopyConfig):
        from canopy_ray.models.encoder import build_encoder

        encoder_threads(cfg.models.query_threads)
        self.encoder = build_encoder(cfg.models, adapter=False)
        self.cache = _query_cache(cfg)
        self.encode.set_max_batch_size(cfg.serve.query_batch_size)
        self.encode.set_batch_wait_timeout_s(cfg.serve.batch_wait_s)
        self.health = ModelHealth(lambda: self.encoder.encode_queries(["health check"]),
                                  cfg.serve.health_check_period_s)

    async def check_health(self):
        """On the replica's event loop, like the batches, so a probe never overlaps one."""
        self.health.check()

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def encode(self, texts: list[str]) -> list[np.ndarray]:
        return _encode_queries(self.encoder, self.cache, self.health, texts)


def _query_cache(cfg: CanopyConfig):
    """A small cache of query vectors, apart from the node cache (whose hit rate is nodes')."""
    from canopy_ray.models.vector_cache import VectorCache

    return VectorCache(min(cfg.models.cache_mb, 32)) if cfg.models.cache_mb else None


def _encode_queries(encoder, cache, health: ModelHealth, texts: list[str]) -> list[np.ndarray]:
    """f0 of ``texts``; with a vector cache, repeated questions (retries, follow-ups, popular
    queries) are encoded once."""
    if cache is None:
        return list(health.run(lambda: encoder.encode_queries(texts)))
    keys = [cache.key(encoder, "query", t) for t in texts]
    found = [cache.get(k) for k in keys]
    todo = [i for i, v in enumerate(found) if v is None]
    if todo:
        fresh = health.run(lambda: encoder.encode_queries([texts[i] for i in todo]))
        for i, v in zip(todo, fresh):
            found[i] = v
            cache.put(keys[i], v)
    return found


def _flatten_encode(encoder, requests: list[list[Piece]]) -> list[tuple[np.ndarray, list[int]]]:
    """One forward pass over every request's nodes; per request its vectors and token counts."""
    flat = [p for r in requests for p in r]
    vecs = encoder.encode_nodes(flat) if flat else np.zeros((0, 0), np.float32)
    tokens = encoder.token_counts(flat) if flat else []
    out, at = [], 0
    for r in requests:
        out.append((vecs[at:at + len(r)], tokens[at:at + len(r)]))
        at += len(r)
    return out


def _flatten_score(encoder, requests: list[tuple[str, list[Piece]]]) -> list[np.ndarray]:
    """A cross-encoder over every request's (question, node) pairs in one length-sorted pass."""
    rows = [encoder.scorer.pair_rows(q, [p.text for p in pieces]) for q, pieces in requests]
    flat = encoder.scorer.score_rows([r for rs in rows for r in rs])
    cuts = np.cumsum([len(rs) for rs in rows])[:-1]
    return np.split(flat, cuts)


class NodeModels:
    """f_theta (``tuned``) and f0 (``frozen``) over node pieces, and f0 over queries, for the
    NodeEncoder deployment or for a Refiner that encodes in its own replica. :meth:`run` answers
    a batch of calls of one kind: ``encode_tuned`` and ``encode_frozen`` (node pieces),
    ``score_tuned`` (with ``models.scorer``: the cross-encoder's scores of (question, nodes))
    and ``query`` (query texts, through a query cache of their own)."""

    def __init__(self, cfg: CanopyConfig):
        from canopy_ray.models.encoder import build_encoder, frozen_nodes

        encoder_threads(cfg.models.threads)
        self.tuned = build_encoder(cfg.models)
        self.frozen = frozen_nodes(self.tuned)
        self.queries = _query_cache(cfg)
        self.health = ModelHealth(self._probe, cfg.serve.health_check_period_s)

    def _probe(self) -> None:
        _flatten_encode(self.tuned, [[Piece("health", "text", ((0, 1),), "Health check.")]])

    def run(self, kind: str, calls: list) -> list:
        if kind == "query":
            return _encode_queries(self.tuned, self.queries, self.health, calls)
        if kind == "score_tuned":
            return self.health.run(lambda: _flatten_score(self.tuned, calls))
        encoder = {"encode_tuned": self.tuned, "encode_frozen": self.frozen}[kind]
        return self.health.run(lambda: _flatten_encode(encoder, calls))

    def identities(self) -> dict:
        """Per node encoder (``tuned``, ``frozen``), what a node store checks its vectors against."""
        from canopy_ray.models.adapters import EncoderIdentity

        return {name: EncoderIdentity(enc.model_id, enc.adapter_id)
                for name, enc in (("tuned", self.tuned), ("frozen", self.frozen))}


@serve.deployment
class NodeEncoder:
    """:class:`NodeModels` as a deployment (``serve.node_encoder: deployment``). Each request
    carries one item set's nodes; ``@serve.batch`` merges concurrent requests into one forward
    pass."""

    def __init__(self, cfg: CanopyConfig):
        self.models = NodeModels(cfg)
        for method in (self.encode_tuned, self.score_tuned, self.encode_frozen, self.query):
            method.set_max_batch_size(cfg.serve.node_batch_size)
            method.set_batch_wait_timeout_s(cfg.serve.batch_wait_s)

    async def check_health(self):
        """On the replica's event loop, like the batches, so a probe never overlaps one."""
        self.models.health.check()

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def encode_tuned(self, requests: list[list[Piece]]) -> list[tuple[np.ndarray, list[int]]]:
        return self.models.run("encode_tuned", requests)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def score_tuned(self, requests: list[tuple[str, list[Piece]]]) -> list[np.ndarray]:
        return self.models.run("score_tuned", requests)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def encode_frozen(self, requests: list[list[Piece]]) -> list[tuple[np.ndarray, list[int]]]:
        return self.models.run("encode_frozen", requests)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def query(self, texts: list[str]) -> list[np.ndarray]:
        """f0 of a policy's bridge queries (:mod:`canopy_ray.core.scoring`)."""
        return self.models.run("query", texts)

    def identities(self) -> dict:
        return self.models.identities()


_REQUEST: contextvars.ContextVar[int | None] = contextvars.ContextVar("canopy_request", default=None)


class Gathered:
    """Merges the encoder calls of the requests one replica works on, without a timer: a call
    waits until every request in :meth:`working` waits for one too, then each kind of call runs
    as one batch. A lone request waits for nothing, and a busy replica encodes the tree levels
    of all its requests together (``@serve.batch`` waits a fixed time instead: latency when
    idle, and batches cut short when the requests' own work between calls outlasts it).
    ``wait_s`` bounds the wait for a request that is busy elsewhere. Requests are told apart by
    a context variable, so the concurrent calls of one request (nodes and cross-encoder pairs)
    count as one request waiting."""

    def __init__(self, run: Callable[[str, list], list], wait_s: float):
        self._run, self.wait_s = run, wait_s
        self.active = 0
        self.pending: dict[str, list[tuple[object, asyncio.Future, int | None]]] = {}
        self.timer: asyncio.TimerHandle | None = None
        self._ids = itertools.count()

    @contextlib.contextmanager
    def working(self):
        token = _REQUEST.set(next(self._ids))
        self.active += 1
        try:
            yield
        finally:
            self.active -= 1
            _REQUEST.reset(token)
            if self.pending and self._waiting() >= self.active:  # the others waited for this one,
                asyncio.get_running_loop().call_soon(self.flush)  # which returns first

    def _waiting(self) -> int:
        return len({request for calls in self.pending.values() for _, _, request in calls})

    async def call(self, kind: str, payload):
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        entry = (payload, future, _REQUEST.get())
        self.pending.setdefault(kind, []).append(entry)
        if self._waiting() >= self.active:
            self.flush()
        elif self.timer is None:
            self.timer = loop.call_later(self.wait_s, self.flush)
        try:
            return await future
        except asyncio.CancelledError:  # its client went away: nothing to encode for it
            if kind in self.pending:
                self.pending[kind] = [e for e in self.pending[kind] if e is not entry]
            raise

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        pending, self.pending = self.pending, {}
        for kind, calls in pending.items():
            calls = [(payload, future) for payload, future, _ in calls if not future.done()]  # done: cancelled
            if not calls:
                continue
            try:
                outs = self._run(kind, [payload for payload, _ in calls])
                for (_, future), out in zip(calls, outs, strict=True):
                    future.set_result(out)
            except BaseException as e:
                for _, future in calls:
                    if not future.done():
                        future.set_exception(e)
                if not isinstance(e, Exception):
                    raise


@serve.deployment
class Refiner:
    """Builds trees, scores the nodes refinement visits and refines. Vectors come from the
    index's node store (items from the index only), the vector cache (any node this replica
    has seen, for /v1/compress and /v1/answer alike) or the node encoder: the NodeEncoder
    deployment's handle or, given none (``serve.node_encoder: refiner``), :class:`NodeModels`
    in this replica, its requests' calls :class:`Gathered` (no call between processes per tree
    level); then :meth:`compress_query` encodes the query here too."""

    def __init__(self, cfg: CanopyConfig, node_encoder=None):
        from canopy_ray.models.llm.tokens import token_counter
        from canopy_ray.models.vector_cache import VectorCache

        self.cfg, self.node_encoder = cfg, node_encoder
        # The reader's tokens, as the ingress counts them; loaded here, not on the first request.
        self.count_tokens = token_counter(cfg.llm)
        self.cache = VectorCache(cfg.models.cache_mb) if cfg.models.cache_mb else None
        self.models = NodeModels(cfg) if node_encoder is None else None
        self.gathered = Gathered(self.models.run, cfg.serve.batch_wait_s) if self.models else None
        self.store = None
        if cfg.serve.index_dir:
            from canopy_ray.index import load_index

            self.store = load_index(cfg.serve.index_dir, verify=False, expect=cfg).nodes  # refuses another encoder's index
        self.compressors: dict | None = None
        from canopy_ray.serve.metrics import NodeSources

        self.sources = NodeSources()  # canopy_nodes_total{source}, canopy_vector_cache_hit_rate

    async def check_health(self):
        if self.models is not None:
            self.models.health.check()

    def _node_call(self, kind: str):
        """An async function for the node encoder's calls of ``kind`` (:meth:`NodeModels.run`)."""
        if self.gathered is not None:
            return functools.partial(self.gathered.call, kind)
        return getattr(self.node_encoder, kind).remote

    def _working(self):
        return self.gathered.working() if self.gathered is not None else contextlib.nullcontext()

    async def _compressor(self, opts: CompressOptions) -> Compressor:
        if self.compressors is None:  # the node store checks vectors against the encoder's identity
            identities = (self.models.identities() if self.models is not None
                          else await self.node_encoder.identities.remote())
            if self.compressors is None:  # not made by a request that waited beside this one
                self.compressors = {(name, store): Compressor.from_config(
                    self.cfg, ident, node_store=self.store if store else None, cache=self.cache,
                    count_tokens=self.count_tokens)
                    for name, ident in identities.items() for store in (True, False)}
        return self.compressors[(opts.node_encoder, opts.use_store)]

    async def compress(self, query_vec: np.ndarray, items: Sequence[Item],
                       opts: CompressOptions = CompressOptions()) -> list[ItemResult]:
        with self._working():
            return await self._compress(query_vec, items, opts)

    async def compress_query(self, query: str, items: Sequence[Item],
                             opts: CompressOptions) -> tuple[list[ItemResult], float]:
        """:meth:`compress` of f0(``query``) encoded here (``serve.node_encoder: refiner``: a
        /v1/compress request is one call); the results and the seconds the query took (its wait
        for the replica's batch included)."""
        if self.gathered is None:
            raise RuntimeError("compress_query needs serve.node_encoder 'refiner'; the Ingress and the "
                               "Refiner were given different configs")
        with self._working():
            t0 = time.perf_counter()
            query_vec = await self.gathered.call("query", query)
            encoded = time.perf_counter() - t0
            return await self._compress(query_vec, items, opts), encoded

    async def _compress(self, query_vec: np.ndarray, items: Sequence[Item],
                        opts: CompressOptions) -> list[ItemResult]:
        comp = await self._compressor(opts)
        method, scorer, query = (self._node_call(k) for k in (f"encode_{opts.node_encoder}", "score_tuned", "query"))

        async def encode(pieces):
            return await method(list(pieces))

        async def score(pieces):  # the policy's cross term
            return await scorer((opts.query, list(pieces)))

        try:
            return await comp.acompress_items(query_vec, items, opts, encode, score, query)
        finally:
            totals: dict[str, int] = {}
            for c in self.compressors.values():
                for k, v in c.stats.items():
                    totals[k] = totals.get(k, 0) + v
            self.sources.export(totals, self.cache.stats() if self.cache else None)

    def stats(self) -> dict:
        """Where node vectors came from, per node encoder, and the vector cache."""
        by_encoder: dict[str, dict] = {}
        for (name, _), comp in (self.compressors or {}).items():
            for k, v in comp.stats.items():
                by_encoder.setdefault(name, {}).setdefault(k, 0)
                by_encoder[name][k] += v
        return {"nodes": by_encoder, "vector_cache": self.cache.stats() if self.cache else None}


@serve.deployment
class ShardSearcher:
    """One FAISS shard of the index; returns global positions."""

    def __init__(self, index_dir: str, shard: int, nprobe: int | str = "auto"):
        from canopy_ray.index import load_shard
        from canopy_ray.index.shards import to_gpus

        self.index = to_gpus(load_shard(index_dir, shard, verify=True, nprobe=nprobe))  # stays on CPU without GPUs

    def search(self, query_vec: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.index.search(query_vec[None, :], k)


@serve.deployment
class Retriever:
    """Top-k item search over the unified index and item fetch by id."""

    def __init__(self, index_dir: str | None, shard_searchers: list | None = None, nprobe: int | str = "auto"):
        from canopy_ray.index import load_index

        # Without an index the deployment still exists (so one Serve YAML fits both cases);
        # the ingress answers /v1/answer with 503 then. The shards are memory-mapped: replicas
        # on one node share one copy of them in the page cache.
        self.index = load_index(index_dir, verify=True, nprobe=nprobe) if index_dir else None
        if self.index is not None:
            from canopy_ray.index.shards import to_gpus

            self.index.shards = to_gpus(self.index.shards)  # a no-op unless the replica was given GPUs
        self.shards = shard_searchers or []

    async def search(self, query_vec: np.ndarray, k: int, modalities=None) -> list[tuple[str, float]]:
        if not self.shards or modalities is not None:  # a modality subset is searched here, exactly
            return self.index.search(np.asarray(query_vec, np.float32)[None, :], k, modalities)[0]
        from canopy_ray.index.shards import merge_topk

        parts = await asyncio.gather(*(s.search.remote(query_vec, k) for s in self.shards))
        scores, positions = merge_topk([p[0] for p in parts], [p[1] for p in parts], k)
        return [(self.index.ids[p], float(s)) for s, p in zip(scores[0], positions[0]) if p >= 0]

    def fetch(self, item_ids: Sequence[str]) -> list[Item]:
        return self.index.items(item_ids)

    def info(self) -> dict:
        if self.index is None:
            return {"count": 0}
        m = self.index.manifest
        return {"count": m["count"], "dim": m["dim"], "model_id": m.get("model_id"),
                "adapter_id": m.get("adapter_id"), "shards": len(m["shards"])}


@serve.deployment
class LLMServer:
    """The local CPU model behind the OpenAI chat-completions protocol. ``chat`` and
    ``chat_stream`` are sync, so Serve runs the blocking generation in its thread pool;
    ``chat_stream`` is a generator (call it with ``handle.options(stream=True)``). A generation
    that raises is answered 500 (OpenAI's shape) and flags the model for ``check_health``, which
    probes it with a one-token generation (also after a minute idle) and fails if that fails."""

    def __init__(self, cfg: CanopyConfig):
        from canopy_ray.models.llm.local import SmolLM2Backend

        self.backend = SmolLM2Backend(cache_dir=cfg.llm.cache_dir, max_new_tokens=cfg.llm.max_new_tokens,
                                      threads=cfg.llm.threads)
        self.created = int(time.time())
        probe = [{"role": "user", "content": "Hi"}]
        self.health = ModelHealth(lambda: self.backend.generate(probe, max_new_tokens=1),
                                  max(60.0, cfg.serve.health_check_period_s))

    async def check_health(self):
        if self.health.due():  # in a thread: the probe waits for the generation lock
            await asyncio.to_thread(self.health.check)

    def chat(self, request: dict) -> tuple[int, dict]:
        from canopy_ray.models.llm.local import handle_chat_completion
        from canopy_ray.models.llm.protocol import LLMRequestError, error_body

        try:
            reply = handle_chat_completion(request, self.backend)
        except LLMRequestError as e:  # the request's fault, not the model's
            return e.status, error_body(e)
        except Exception as e:  # the model's: check_health probes it
            self.health.failed(e)
            return 500, error_body(LLMRequestError(f"generation failed: {type(e).__name__}", status=500,
                                                   code="server_error"))
        self.health.ok()
        return 200, reply

    def chat_stream(self, request: dict):
        """First ``(status, error body or None)``, then, on 200, the ``chat.completion.chunk``
        dicts as tokens are decoded."""
        from canopy_ray.models.llm.local import stream_chat_completion
        from canopy_ray.models.llm.protocol import LLMRequestError, error_body

        try:
            chunks = stream_chat_completion(request, self.backend)
        except LLMRequestError as e:
            yield e.status, error_body(e)
            return
        yield 200, None
        yield from chunks

    def model(self) -> dict:
        """The served model as an OpenAI ``/v1/models`` entry."""
        return {"id": self.backend.model_name, "object": "model", "created": self.created, "owned_by": "canopy-ray"}
