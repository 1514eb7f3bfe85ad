"""The fp16 node store: memory-mapped lookup and on-the-fly fallback."""

import numpy as np
import pytest

from canopy_ray.core.evidence import piece
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import TextItem
from canopy_ray.index.node_store import NodeStore, NodeStoreWriter


class CountingEncoder:
    """Deterministic stand-in: a node's vector is a hash of its text."""

    dim = 8

    def __init__(self, adapter_id="frozen", model_id="fake"):
        self.adapter_id, self.model_id, self.calls = adapter_id, model_id, 0

    def token_counts(self, pieces):
        return [1] * len(pieces)

    def encode_nodes(self, pieces):
        self.calls += len(pieces)
        out = []
        for p in pieces:
            v = np.random.default_rng(abs(hash(p.text)) % 2**32).standard_normal(self.dim)
            out.append(v / np.linalg.norm(v))
        return np.array(out, np.float32)


def tree(item_id, n):
    return build_tree(TextItem(item_id, "T", tuple(f"Sentence {i} of {item_id}." for i in range(n))))


@pytest.fixture()
def store_dir(tmp_path):
    enc = CountingEncoder()
    trees = [tree("a", 5), tree("b", 1), tree("c", 3)]
    total = sum(len(t.nodes()) for t in trees)
    w = NodeStoreWriter(tmp_path, total, enc.dim)
    for t in trees:
        spans = np.array([n.span for n in t.nodes()], np.int32)
        w.add(t.item.id, spans, enc.encode_nodes([piece(t, [tuple(s)]) for s in spans]))
    entry = w.close()
    assert entry["nodes"] == total == 9 + 1 + 5
    return tmp_path


def test_lookup_is_memory_mapped_and_fp16(store_dir):
    store = NodeStore.load(store_dir, adapter_id="frozen", model_id="fake")
    assert isinstance(store._vectors, np.memmap) and store._vectors.dtype == np.float16
    assert len(store) == 3 and "b" in store and "z" not in store
    cached = store.lookup("a")
    assert set(cached) == {n.span for n in tree("a", 5).nodes()}


Q = np.ones(8, np.float32) / np.sqrt(8)


def compress(store, enc, trees):
    """Compress through the Compressor, the store's consumer; the stats say what came from where."""
    from canopy_ray.compressor import Compressor

    comp = Compressor(enc, node_store=store, policy="canopy margin=0")
    return comp.compress_items(Q, [t.item for t in trees]), comp.stats


def test_cached_vectors_match_fresh_encoding_and_count_hits(store_dir):
    store = NodeStore.load(store_dir, adapter_id="frozen", model_id="fake")
    enc = CountingEncoder()
    (r,), stats = compress(store, enc, [tree("a", 5)])
    assert enc.calls == 0 and stats["store"] == len(r.scores) and stats["encoded"] == 0
    cached = store.lookup("a")
    t = tree("a", 5)
    fresh = CountingEncoder().encode_nodes([piece(t, [n.span]) for n in t.nodes()])
    np.testing.assert_allclose(np.stack([cached[n.span] for n in t.nodes()]), fresh, atol=2e-3)  # fp16


def test_unknown_item_falls_back_to_the_encoder(store_dir):
    store = NodeStore.load(store_dir, adapter_id="frozen", model_id="fake")
    enc = CountingEncoder()
    (r,), stats = compress(store, enc, [tree("new", 4)])
    assert enc.calls == stats["encoded"] == len(r.scores) > 0 and stats["store"] == 0
    assert store.lookup("new") is None


def test_changed_adapter_falls_back_for_every_node(store_dir):
    store = NodeStore.load(store_dir, adapter_id="frozen", model_id="fake")
    enc = CountingEncoder(adapter_id="lora-0123")
    assert not store.usable_for(enc) and store.usable_for(CountingEncoder())
    assert not store.usable_for(CountingEncoder(model_id="other"))
    (r,), stats = compress(store, enc, [tree("a", 5)])
    assert enc.calls == len(r.scores) and stats["store"] == 0


def test_other_branching_encodes_only_the_spans_the_store_lacks(store_dir):
    from canopy_ray.compressor import CompressOptions, Compressor

    store = NodeStore.load(store_dir, adapter_id="frozen", model_id="fake")
    stored = store.lookup("a")
    enc = CountingEncoder()
    comp = Compressor(enc, node_store=store, policy="canopy margin=0")
    (r,) = comp.compress_items(Q, [tree("a", 5).item], CompressOptions(branching=3))
    assert [c.span for c in r.tree.root.children] == [(0, 2), (2, 4), (4, 5)]
    assert enc.calls == comp.stats["encoded"] == sum(s not in stored for s in r.scores)
    assert comp.stats["store"] == sum(s in stored for s in r.scores) > 0
    assert NodeStore.empty().lookup("a") is None and len(NodeStore.empty()) == 0
