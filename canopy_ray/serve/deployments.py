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

from canopy_ray.compressor import Compressor, ItemResult
from canopy_ray.config import CanopyConfig
from canopy_ray.core.evidence import Piece
from canopy_ray.core.items import Item


def _encoder(cfg: CanopyConfig, adapter: bool):
    from canopy_ray.models.encoder import build_encoder

    models = cfg.models if adapter else cfg.models.model_copy(update={"adapter": None})
    return build_encoder(models)


@serve.deployment
class QueryEncoder:
    """f0 over query strings; concurrent requests are batched with ``@serve.batch``."""

    def __init__(self, cfg: CanopyConfig):
        self.encoder = _encoder(cfg, adapter=False)
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
        self.encoder = _encoder(cfg, adapter=True)
        for method in (self.encode_tuned, self.encode_frozen):
            method.set_max_batch_size(cfg.serve.node_batch_size)
            method.set_batch_wait_timeout_s(cfg.serve.batch_wait_s)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def encode_tuned(self, requests: list[list[Piece]]) -> list[np.ndarray]:
        return _flatten_encode(self.encoder.encode_nodes, requests)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
    async def encode_frozen(self, requests: list[list[Piece]]) -> list[np.ndarray]:
        return _flatten_encode(self.encoder.encode_items, requests)  # f0 over piece text

    def identity(self) -> dict:
        return {"adapter_id": self.encoder.adapter_id, "model_id": getattr(self.encoder, "model_id", None)}


class _EncoderInfo:
    """What a node store checks to decide whether its vectors fit an encoder."""

    def __init__(self, adapter_id: str, model_id: str | None):
        self.adapter_id, self.model_id = adapter_id, model_id


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

    async def _compressor(self, node_encoder: str, use_store: bool) -> Compressor:
        if self.compressors is None:  # the node store checks vectors against the encoder's identity
            ident = await self.node_encoder.identity.remote()
            encoders = {"tuned": _EncoderInfo(ident["adapter_id"], ident["model_id"]),
                        "frozen": _EncoderInfo("frozen", ident["model_id"])}
            self.compressors = {(name, store): Compressor.from_config(
                self.cfg, enc, node_store=self.store if store else None)
                for name, enc in encoders.items() for store in (True, False)}
        return self.compressors[(node_encoder, use_store)]

    async def compress(self, query_vec: np.ndarray, items: Sequence[Item], branching: int | None = None,
                       whole: frozenset[str] = frozenset(), mode: str = "canopy", flat_m: int = 5,
                       round: int = 1, node_encoder: str = "tuned", use_store: bool = False) -> list[ItemResult]:
        comp = await self._compressor(node_encoder, use_store)
        method = self.node_encoder.encode_tuned if node_encoder == "tuned" else self.node_encoder.encode_frozen

        async def encode(pieces):
            return await method.remote(list(pieces))

        trees = comp.trees(items, branching, whole, mode)
        vecs = await comp.anode_vectors(trees, encode)
        return comp.finish(query_vec, trees, vecs, mode, flat_m, round)

    def stats(self) -> dict:
        return {f"{enc}{'+store' if store else ''}": c.stats for (enc, store), c in (self.compressors or {}).items()}


@serve.deployment
class ShardSearcher:
    """One FAISS shard of the index; returns global positions."""

    def __init__(self, index_dir: str, shard: int):
        import json
        from pathlib import Path

        import faiss

        from canopy_ray.index.shards import ShardedIndex

        manifest = json.loads((Path(index_dir) / "manifest.json").read_text())
        entry = manifest["shards"][shard]
        index = faiss.read_index(str(Path(index_dir) / entry["file"]))
        self.index = ShardedIndex([index], [entry["offset"], entry["offset"] + index.ntotal], manifest["index_type"])

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

    def count_tokens(self, text: str) -> int:
        return self.backend.count_tokens(text)
