"""Caches that make repeated evaluation cheap without changing any result.

- :class:`CachingEncoder` memoises an encoder's query and item vectors by input, in memory:
  methods and sweep points of one worker share the candidates' item vectors (node vectors go
  through the compressor's bounded :class:`~canopy_ray.models.vector_cache.VectorCache`).
- :class:`CachedChatClient` memoises chat completions in SQLite, keyed by the model name and
  the whole request (messages, schema, max_tokens). The local and served readers decode
  greedily, so a hit returns exactly what the model would say; identical prompts recur across
  methods and points (``frozen`` without an adapter, B for methods that pass items whole, k
  beyond a question's candidates) and across reruns, which makes a killed run cheap to resume.
  A hit keeps the original call's latency in ``saved_s`` so reports can count it.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np

from canopy_ray.models.llm.protocol import ChatResult


class CachingEncoder:
    """Wraps an encoder; same interface, vectors memoised per (kind, text, media)."""

    def __init__(self, encoder):
        self.inner = encoder
        self.dim, self.model_id, self.adapter_id = encoder.dim, encoder.model_id, encoder.adapter_id
        self._memo: dict[tuple, np.ndarray] = {}
        self.hits = self.misses = 0

    def _cached(self, kind: str, keys: list, inputs: list, fn) -> np.ndarray:
        todo = [i for i, k in enumerate(keys) if (kind, k) not in self._memo]
        if todo:
            vecs = fn([inputs[i] for i in todo])
            for i, v in zip(todo, vecs):
                self._memo[(kind, keys[i])] = np.asarray(v, np.float32)
        self.misses += len(todo)
        self.hits += len(keys) - len(todo)
        if not keys:
            return np.zeros((0, self.dim), np.float32)
        return np.stack([self._memo[(kind, k)] for k in keys])

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        return self._cached("q", texts, texts, self.inner.encode_queries)

    def encode_items(self, items) -> np.ndarray:
        items = list(items)
        return self._cached("i", [(p.text, p.media) for p in items], items, self.inner.encode_items)

    def encode_nodes(self, nodes) -> np.ndarray:
        return self.inner.encode_nodes(nodes)

    def token_counts(self, nodes) -> list[int]:
        return self.inner.token_counts(nodes)


def request_key(model: str, messages, response_format, max_tokens) -> str:
    blob = json.dumps([model, messages, response_format, max_tokens], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class CachedChatClient:
    """A chat client in front of another, answering repeated requests from SQLite.

    Safe for several processes on one machine (SQLite with a busy timeout); on a multi-node
    cluster each node keeps its own file unless the path is on shared storage.
    """

    def __init__(self, client, path: str | Path):
        self.client, self.model = client, getattr(client, "model", "")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), timeout=60, check_same_thread=False)
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("CREATE TABLE IF NOT EXISTS chat (key TEXT PRIMARY KEY, result TEXT NOT NULL)")
            self._db.commit()
        self.hits, self.misses = 0, 0
        self.saved_s: Counter = Counter()  # role -> seconds the cached calls originally took

    def _get(self, key: str) -> ChatResult | None:
        with self._lock:
            row = self._db.execute("SELECT result FROM chat WHERE key = ?", (key,)).fetchone()
        return ChatResult(**json.loads(row[0])) if row else None

    def _put(self, key: str, result: ChatResult) -> None:
        blob = json.dumps(result.__dict__)
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO chat (key, result) VALUES (?, ?)", (key, blob))
            self._db.commit()

    @staticmethod
    def _role(response_format) -> str:
        try:
            return response_format["json_schema"]["name"].removeprefix("canopy_")
        except (TypeError, KeyError):
            return "chat"

    def _lookup(self, messages, response_format, max_tokens):
        key = request_key(self.model, list(messages), response_format, max_tokens)
        hit = self._get(key)
        if hit is not None:
            self.hits += 1
            self.saved_s[self._role(response_format)] += hit.latency_s
        return key, hit

    def _store(self, key: str, result: ChatResult, t0: float) -> ChatResult:
        self.misses += 1
        if not result.latency_s:
            result = ChatResult(**(result.__dict__ | {"latency_s": time.perf_counter() - t0}))
        self._put(key, result)
        return result

    def chat(self, messages, *, response_format=None, max_tokens=None) -> ChatResult:
        key, hit = self._lookup(messages, response_format, max_tokens)
        if hit is not None:
            return hit
        t0 = time.perf_counter()
        return self._store(key, self.client.chat(messages, response_format=response_format,
                                                 max_tokens=max_tokens), t0)

    async def achat(self, messages, *, response_format=None, max_tokens=None) -> ChatResult:
        key, hit = self._lookup(messages, response_format, max_tokens)
        if hit is not None:
            return hit
        t0 = time.perf_counter()
        return self._store(key, await self.client.achat(messages, response_format=response_format,
                                                        max_tokens=max_tokens), t0)

    def close(self) -> None:
        with self._lock:
            self._db.close()
