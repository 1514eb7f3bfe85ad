"""A bounded, content-addressed cache of node vectors: never encode the same node twice.

Node vectors do not depend on the query, and retrieved passages repeat (across questions,
and across a question's rounds: the paper finds 63% of follow-up hits repeat). The key is
the node encoder's identity (base model, adapter) and a hash of what it encodes (the node's
text and media), so a changed adapter or text never reads a stale vector. Least recently
used entries go first once the vectors exceed ``max_mb``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict

import numpy as np


class VectorCache:
    def __init__(self, max_mb: float):
        self.max_bytes = int(max_mb * 2**20)
        self._entries: OrderedDict[bytes, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # a Serve replica may call from its thread pool
        self.bytes = self.hits = self.misses = self.evicted = 0

    @staticmethod
    def key(encoder, kind: str, text: str, media=()) -> bytes:
        """What the vector depends on, hashed: the encoder (model, adapter), the kind of input
        (``node``, ``query``: an encoder may prompt them differently), the text and media."""
        blob = json.dumps([encoder.model_id, encoder.adapter_id, kind, text, media])
        return hashlib.sha1(blob.encode()).digest()

    def get(self, key: bytes) -> np.ndarray | None:
        with self._lock:
            vec = self._entries.get(key)
            if vec is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return vec

    def put(self, key: bytes, vec: np.ndarray) -> None:
        vec = np.asarray(vec, np.float32)
        if vec.nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old.nbytes
            self._entries[key] = vec
            self.bytes += vec.nbytes
            while self.bytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self.bytes -= dropped.nbytes
                self.evicted += 1

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> dict:
        return {"entries": len(self), "bytes": self.bytes, "max_bytes": self.max_bytes,
                "hits": self.hits, "misses": self.misses, "evicted": self.evicted}
