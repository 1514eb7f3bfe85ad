"""Sharded FAISS search against one exact IndexFlatIP on the same vectors."""

import faiss
import numpy as np
import pytest

from canopy_ray.index.shards import ShardedIndex, merge_topk, shard_bounds


def unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return unit(rng, 1000, 48), unit(rng, 25, 48)


def test_shard_bounds_near_equal_earlier_larger():
    assert shard_bounds(10, 3) == [0, 4, 7, 10]
    assert shard_bounds(2, 5) == [0, 1, 2]
    assert shard_bounds(0, 3) == [0, 0]


@pytest.mark.parametrize("n_shards", [1, 3, 7])
def test_flat_shards_equal_one_flat_index(data, n_shards):
    base, queries = data
    ref = faiss.IndexFlatIP(base.shape[1])
    ref.add(base)
    d_ref, i_ref = ref.search(queries, 10)
    index = ShardedIndex.build(base, n_shards, "flat")
    assert [s.ntotal for s in index.shards] == np.diff(shard_bounds(1000, n_shards)).tolist()
    d, i = index.search(queries, 10)
    np.testing.assert_array_equal(i, i_ref)
    np.testing.assert_allclose(d, d_ref, atol=1e-5)


def test_fp16_shards_equal_one_fp16_index_and_recall_vs_exact(data):
    base, queries = data
    ref = faiss.IndexScalarQuantizer(base.shape[1], faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
    ref.train(base)
    ref.add(base)
    d_ref, i_ref = ref.search(queries, 10)
    d, i = ShardedIndex.build(base, 4, "sq_fp16").search(queries, 10)
    np.testing.assert_array_equal(i, i_ref)
    np.testing.assert_allclose(d, d_ref, atol=1e-5)
    _, i_exact = faiss.IndexFlatIP(base.shape[1]), None
    exact = faiss.IndexFlatIP(base.shape[1])
    exact.add(base)
    _, i_exact = exact.search(queries, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(i, i_exact)])
    assert recall >= 0.99


def test_k_larger_than_count_pads_with_minus_one():
    base = unit(np.random.default_rng(1), 5, 8)
    d, i = ShardedIndex.build(base, 3, "flat").search(base[:2], 8)
    assert i.shape == (2, 8)
    assert (i[:, :5] >= 0).all() and (i[:, 5:] == -1).all()
    assert i[0, 0] == 0 and i[1, 0] == 1
    assert np.isneginf(d[:, 5:]).all()


def test_merge_breaks_ties_by_position():
    d, p = merge_topk([np.array([[0.5, 0.1]]), np.array([[0.5, -1.0]])],
                      [np.array([[7, 3]]), np.array([[2, -1]])], 3)
    assert p.tolist() == [[2, 7, 3]]


def test_save_load_roundtrip_and_checksum(tmp_path, data):
    base, queries = data
    index = ShardedIndex.build(base, 3, "sq_fp16")
    entries = index.save(tmp_path)
    assert [e["file"] for e in entries] == ["shard-000.faiss", "shard-001.faiss", "shard-002.faiss"]
    loaded = ShardedIndex.load(tmp_path, entries, "sq_fp16")
    np.testing.assert_array_equal(loaded.search(queries, 10)[1], index.search(queries, 10)[1])
    assert index.memory_bytes() < base.nbytes * 0.6  # fp16 codes: half of fp32, plus headers
    with open(tmp_path / "shard-001.faiss", "r+b") as f:
        f.seek(-4, 2)
        f.write(b"\0\1\2\3")
    with pytest.raises(ValueError, match="checksum"):
        ShardedIndex.load(tmp_path, entries, "sq_fp16")


def test_streaming_add_must_be_in_row_order():
    base = unit(np.random.default_rng(2), 10, 8)
    index = ShardedIndex.empty(8, shard_bounds(10, 2), "flat")
    index.add(base[:3], 0)
    with pytest.raises(ValueError, match="row order"):
        index.add(base[6:], 6)
