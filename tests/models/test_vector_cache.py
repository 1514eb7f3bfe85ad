"""The node-vector cache: content-addressed by encoder identity, bounded by bytes, LRU."""

import numpy as np

from canopy_ray.models.adapters import EncoderIdentity
from canopy_ray.models.vector_cache import VectorCache

F0, TUNED = EncoderIdentity("minilm", "frozen"), EncoderIdentity("minilm", "lora-1")


def test_keys_separate_encoders_kinds_text_and_media():
    k = VectorCache.key
    assert k(F0, "node", "a") == k(EncoderIdentity("minilm", "frozen"), "node", "a")
    distinct = {k(F0, "node", "a"), k(TUNED, "node", "a"), k(F0, "query", "a"), k(F0, "node", "b"),
                k(F0, "node", "a", (("v.mp4", 10.0),)), k(EncoderIdentity("other", "frozen"), "node", "a")}
    assert len(distinct) == 6


def test_least_recently_used_goes_first_within_the_byte_budget():
    vec = np.ones(256, np.float32)  # 1 KiB
    cache = VectorCache(max_mb=3 / 1024)  # room for three
    for name in "abc":
        cache.put(name.encode(), vec * ord(name))
    assert cache.get(b"a")[0] == ord("a")  # a is now the most recent
    cache.put(b"d", vec)
    assert cache.get(b"b") is None and cache.get(b"a") is not None and cache.get(b"d") is not None
    assert len(cache) == 3 and cache.bytes == 3 * vec.nbytes <= cache.max_bytes
    s = cache.stats()
    assert (s["hits"], s["misses"], s["evicted"]) == (3, 1, 1)
    cache.put(b"a", vec * 2)  # replacing an entry does not grow the cache
    assert cache.bytes == 3 * vec.nbytes and cache.get(b"a")[0] == 2
