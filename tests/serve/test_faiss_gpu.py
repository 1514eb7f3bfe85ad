"""FAISS shards on GPU (``canopy_ray.index.shards.to_gpus``): the CPU part of the path (the
flat form a GPU takes) gives the same results as the shards; with GPUs, the moved index does."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from canopy_ray.index.shards import ShardedIndex, gpu_flat, to_gpus


def _data(n=500, dim=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x, x[:7] + 0.05 * rng.standard_normal((7, dim)).astype(np.float32)


@pytest.mark.parametrize("index_type", ["sq_fp16", "flat"])
def test_gpu_flat_form_searches_like_the_shard(index_type):
    x, q = _data()
    index = ShardedIndex.build(x, 3, index_type)
    flat = ShardedIndex([gpu_flat(s) for s in index.shards], index.offsets, index_type)
    assert all(isinstance(s, faiss.IndexFlat) for s in flat.shards)
    d0, p0 = index.search(q, 10)
    d1, p1 = flat.search(q, 10)
    np.testing.assert_array_equal(p0, p1)
    np.testing.assert_allclose(d0, d1, atol=1e-6)
    if index_type == "sq_fp16":  # the fp16 values, not the fp32 originals
        assert not np.allclose(flat.shards[0].reconstruct_n(0, 5), x[:5], atol=1e-6)


@pytest.mark.skipif(faiss.get_num_gpus() > 0, reason="GPUs present")
def test_without_gpus_the_index_stays_on_cpu():
    index = ShardedIndex.build(_data()[0], 2)
    assert to_gpus(index) is index


@pytest.mark.skipif(faiss.get_num_gpus() == 0, reason="needs faiss-gpu and a GPU")
@pytest.mark.parametrize("index_type", ["sq_fp16", "flat"])
def test_gpu_index_matches_cpu(index_type):
    x, q = _data(5000, 64)
    index = ShardedIndex.build(x, 4, index_type)
    moved = to_gpus(index)
    assert moved is not index and moved.offsets == index.offsets
    d0, p0 = index.search(q, 10)
    d1, p1 = moved.search(q, 10)
    np.testing.assert_array_equal(p0, p1)
    np.testing.assert_allclose(d0, d1, atol=1e-3)
