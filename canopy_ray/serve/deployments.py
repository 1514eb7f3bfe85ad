"""The Serve deployments behind the ingress: one model or data structure each.

QueryEncoder (f0, batched), NodeEncoder (f_theta or f0 over node pieces, batched),
Retriever (FAISS search and item fetch, optionally fanning out to one ShardSearcher per
shard), Refiner (trees, cached node vectors, refinement) and LLMServer (the local CPU
model behind the chat-completions protocol).
"""

from __future__ import annotations

import asyncio
from typing import Sequence

import numpy as np
from ray import serve

from canopy_ray.compressor import CompressOptions, Compressor, ItemResult
from canopy_ray.config import CanopyConfig
from canopy_ray.core.evidence import Piece
from canopy_ray.core.items import Item


@serve.deployment
class QueryEncoder:
    """f0 over query strings; concurrent requests are batched with ``@serve.batch``."""

    def __init__(self, cfg: CanopyConfig):
        from canopy_ray.models.encoder import build_encoder

        self.encoder = build_encoder(cfg.models, adapter=False)
        self.encode.set_max_batch_size(cfg.serve.query_batch_size)
        self.encode.set_batch_wait_timeout_s(cfg.serve.batch_wait_s)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def encode(self, texts: list[str]) -> list[np.ndarray]:
        return list(self.encoder.encode_queries(texts))


def _flatten_encode(encode, requests: list[list[Piece]]) -> list[np.ndarray]:
    flat = [p for r in requests for p in r]
    vecs = encode(flat) if flat else np.zeros((0, 0), np.float32)
    out, at = [], 0
    for r in requests:
        out.append(vecs[at:at + len(r)])
        at += len(r)
    return out


@serve.deployment
class NodeEncoder:
    """f_theta (``tuned``) or f0 (``frozen``) over node pieces. Each request carries one
    item set's nodes; ``@serve.batch`` merges concurrent requests into one forward pass."""

    def __init__(self, cfg: CanopyConfig):
        from canopy_ray.models.encoder import build_encoder, frozen_nodes

        self.tuned = build_encoder(cfg.models)
        self.frozen = frozen_nodes(self.tuned)
        for method in (self.encode_tuned, self.encode_frozen):
            method.set_max_batch_size(cfg.serve.node_batch_size)
            method.set_batch_wait_timeout_s(cfg.serve.batch_wait_s)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def encode_tuned(self, requests: list[list[Piece]]) -> list[np.ndarray]:
        return _flatten_encode(self.tuned.encode_nodes, requests)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def encode_frozen(self, requests: list[list[Piece]]) -> list[np.ndarray]:
        return _flatten_encode(self.frozen.encode_nodes, requests)

    def identities(self) -> dict:
        """Per node encoder (``tuned``, ``frozen``), what a node store checks its vectors against."""
        from canopy_ray.models.adapters import EncoderIdentity

        return {name: EncoderIdentity(enc.model_id, enc.adapter_id)
                for name, enc in (("tuned", self.tuned), ("frozen", self.frozen))}


@serve.deployment
class Refiner:
    """Builds trees, takes node vectors from the index's node store (items from the index
    only) or the NodeEncoder, scores and refines."""

    def __init__(self, cfg: CanopyConfig, node_encoder):
        self.cfg, self.node_encoder = cfg, node_encoder
        self.store = None
        if cfg.serve.index_dir:
            from canopy_ray.index import load_index

            self.store = load_index(cfg.serve.index_dir, verify=False).nodes
        self.compressors: dict | None = None

    async def _compressor(self, opts: CompressOptions) -> Compressor:
        if self.compressors is None:  # the node store checks vectors against the encoder's identity
            identities = await self.node_encoder.identities.remote()
            self.compressors = {(name, store): Compressor.from_config(
                self.cfg, ident, node_store=self.store if store else None)
                for name, ident in identities.items() for store in (True, False)}
        return self.compressors[(opts.node_encoder, opts.use_store)]

    async def compress(self, query_vec: np.ndarray, items: Sequence[Item],
                       opts: CompressOptions = CompressOptions()) -> list[ItemResult]:
        comp = await self._compressor(opts)
        method = self.node_encoder.encode_tuned if opts.node_encoder == "tuned" else self.node_encoder.encode_frozen

        async def encode(pieces):
            return await method.remote(list(pieces))

        trees = comp.trees(items, opts)
        return comp.finish(query_vec, trees, await comp.anode_vectors(trees, encode), opts)


@serve.deployment
class ShardSearcher:
    """One FAISS shard of the index; returns global positions."""

    def __init__(self, index_dir: str, shard: int):
        from canopy_ray.index import load_shard

        self.index = load_shard(index_dir, shard, verify=True)

    def search(self, query_vec: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.index.search(query_vec[None, :], k)


@serve.deployment
class Retriever:
    """Top-k item search over the unified index and item fetch by id."""

    def __init__(self, index_dir: str | None, shard_searchers: list | None = None):
        from canopy_ray.index import load_index

        # Without an index the deployment still exists (so one Serve YAML fits both cases);
        # the ingress answers /v1/answer with 503 then.
        self.index = load_index(index_dir, verify=True) if index_dir else None
        self.shards = shard_searchers or []

    async def search(self, query_vec: np.ndarray, k: int) -> list[tuple[str, float]]:
        if not self.shards:
            return self.index.search(np.asarray(query_vec, np.float32)[None, :], k)[0]
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
    """The local CPU model behind the OpenAI chat-completions protocol. ``chat`` is a sync
    method, so Serve runs the blocking generation in its thread pool."""

    def __init__(self, cfg: CanopyConfig):
        from canopy_ray.models.llm.local import SmolLM2Backend

        self.backend = SmolLM2Backend(cache_dir=cfg.llm.cache_dir, max_new_tokens=cfg.llm.max_new_tokens,
                                      threads=cfg.llm.threads)

    def chat(self, request: dict) -> tuple[int, dict]:
        from canopy_ray.models.llm.local import handle_chat_completion
        from canopy_ray.models.llm.protocol import LLMRequestError, error_body

        try:
            return 200, handle_chat_completion(request, self.backend)
        except LLMRequestError as e:
            return e.status, error_body(e)

