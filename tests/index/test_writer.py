"""The index writer (what the job and benchmarks/scale.py write through), the mapped load, the
sharded merge against one exact index, and the approximate ``ivf`` form."""

import json
import shutil
import sys
import threading
from pathlib import Path

import faiss
import numpy as np
import pytest

from canopy_ray.config import ConfigError, load_config
from canopy_ray.index import load_index
from canopy_ray.index.ids import ItemIds
from canopy_ray.index.shards import ShardedIndex, ShardFile, auto_nlist, trained
from canopy_ray.index.writer import IndexWriter

DIM = 32
CPU_YAML = Path(__file__).resolve().parents[2] / "configs" / "cpu.yaml"


def clustered(n, seed, d=DIM, clusters=100):
    """Unit vectors around ``clusters`` centres (neighbours mostly, not only, in one cluster)."""
    r = np.random.default_rng(seed)
    centres = np.random.default_rng(99).standard_normal((clusters, d)).astype(np.float32)
    x = centres[r.integers(0, clusters, n)] + r.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def write(out, vecs, index_type="sq_fp16", shards=3, chunk=97, nodes=True, nlist=None):
    """Write ``vecs`` through the writer in uneven chunks, 1 + (i % 3) nodes for item i."""
    n = len(vecs)
    counts = 1 + np.arange(n) % 3
    node_vecs = np.random.default_rng(5).standard_normal((int(counts.sum()), DIM)).astype(np.float16)
    spans = np.stack([np.arange(len(node_vecs)), np.arange(len(node_vecs)) + 1], 1).astype(np.int32)
    sample = vecs[::2] if index_type == "ivf" else None
    w = IndexWriter(out, count=n, dim=DIM, nodes=int(counts.sum()) if nodes else 0, index_type=index_type,
                    shards=shards, sample=sample, nlist=nlist)
    at_node = 0
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        ids = [f"it-{i}" for i in range(a, b)]
        items = [json.dumps({"id": i, "modality": "text", "text": f"Item {i}."}) for i in ids]
        c = counts[a:b]
        m = int(c.sum())
        extra = (c, spans[at_node:at_node + m], node_vecs[at_node:at_node + m]) if nodes else ()
        w.add(ids, ["text"] * (b - a), items, vecs[a:b], *extra)
        at_node += m
    return w.close(model_id="m", encoder="minilm", adapter_id="a"), counts, node_vecs


def test_writer_writes_an_index_that_loads_and_searches_like_one_flat_index(tmp_path):
    vecs, queries = clustered(1000, 0), clustered(40, 1)
    manifest, counts, node_vecs = write(tmp_path, vecs)
    assert manifest["count"] == 1000 and manifest["nodes"] == counts.sum() and manifest["index_type"] == "sq_fp16"
    assert [e["count"] for e in manifest["shards"]] == [334, 333, 333]
    index = load_index(tmp_path, verify=True)
    assert index.ids == [f"it-{i}" for i in range(1000)]
    # exact merge: the fp16 shards answer exactly as one fp16 index, and as IndexFlatIP up to fp16 ties
    one = faiss.IndexScalarQuantizer(DIM, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
    one.train(vecs)
    one.add(vecs)
    d_ref, i_ref = one.search(queries, 10)
    d, i = index.shards.search(queries, 10)
    np.testing.assert_array_equal(i, i_ref)
    np.testing.assert_allclose(d, d_ref, atol=1e-5)
    exact = faiss.IndexFlatIP(DIM)
    exact.add(vecs)
    assert np.mean([len(set(a) & set(b)) for a, b in zip(i, exact.search(queries, 10)[1])]) >= 9.9
    hits = index.search(queries[:1], 3)[0]
    assert [h[0] for h in hits] == [f"it-{p}" for p in i_ref[0, :3]]
    assert index.item("it-517").id == "it-517"
    # node store: item 517's rows, in the order they were added
    o = int(counts[:517].sum())
    got = index.nodes.lookup("it-517")
    np.testing.assert_array_equal(np.stack(list(got.values())), node_vecs[o:o + counts[517]].astype(np.float32))


def test_loaded_shards_are_memory_mapped_not_copied(tmp_path):
    vecs = clustered(20000, 2, d=DIM)
    write(tmp_path, vecs, shards=1, chunk=5000, nodes=False)
    copied = load_index(tmp_path, mmap=False).shards.shards[0]
    mapped = load_index(tmp_path, mmap=True).shards.shards[0]
    # a mapped index's codes live in the file's pages (a copy owns its buffer)
    assert copied.codes.is_owned and not mapped.codes.is_owned
    q = vecs[:5]
    np.testing.assert_array_equal(copied.search(q, 10)[1], mapped.search(q, 10)[1])


@pytest.mark.parametrize("index_type", ["sq_fp16", "flat"])
def test_shard_file_streams_exactly_what_faiss_writes_for_the_whole_shard(tmp_path, index_type):
    vecs = clustered(500, 6)
    whole = trained(DIM, index_type)
    whole.add(vecs)
    f = ShardFile(tmp_path / "s.faiss", trained(DIM, index_type))
    for a in range(0, 500, 123):
        f.add(vecs[a:a + 123])
    entry = f.close(offset=7)
    assert entry["count"] == 500 and entry["offset"] == 7
    assert (tmp_path / "s.faiss").read_bytes() == faiss.serialize_index(whole).tobytes()


def test_writer_refuses_more_or_fewer_rows_than_announced(tmp_path):
    w = IndexWriter(tmp_path, count=3, dim=DIM)
    with pytest.raises(ValueError, match="opened for 3"):
        w.add(["a", "b", "c", "d"], ["text"] * 4, ["{}"] * 4, clustered(4, 3))
    w.add(["a"], ["text"], ["{}"], clustered(1, 3))
    with pytest.raises(ValueError, match="1 were added"):
        w.close()


def test_item_ids_find_positions_and_count_duplicates():
    ids = ItemIds(["b", "a", "c", "a2"])
    assert [ids.position(x) for x in ("a", "a2", "b", "c")] == [1, 3, 0, 2]
    with pytest.raises(KeyError):
        ids.position("zz")
    assert ids.duplicates() == 0 and ItemIds(["x", "y", "x", "x"]).duplicates() == 2
    assert ids == ["b", "a", "c", "a2"] and ids[1:3] == ["a", "c"]


def test_item_ids_first_lookups_from_many_threads_at_once():
    """A Serve replica runs sync methods (the Retriever's fetch) in a thread pool: the first
    lookups race to sort the ids, and none may see half of that work."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        for _ in range(200):
            ids, start, errors = ItemIds([f"id-{i}" for i in range(50)]), threading.Barrier(8), []

            def look():
                start.wait()
                try:
                    assert ids.position("id-7") == 7
                except Exception as e:
                    errors.append(e)

            threads = [threading.Thread(target=look) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors, errors[0]
    finally:
        sys.setswitchinterval(old)


def recall(got, want):
    return float(np.mean([len(set(a[a >= 0]) & set(b)) / want.shape[1] for a, b in zip(got, want)]))


def test_ivf_recall_grows_with_nprobe_and_all_lists_equal_the_flat_form():
    vecs, queries = clustered(6000, 4), clustered(100, 5)
    flat = ShardedIndex.build(vecs, 2, "sq_fp16")
    ivf = ShardedIndex.build(vecs, 2, "ivf", nlist=64)
    assert all(isinstance(s, faiss.IndexIVF) and s.nlist == 64 for s in ivf.shards)
    # one training, shared by every shard: the same lists
    c0, c1 = (faiss.vector_to_array(faiss.downcast_index(s.quantizer).codes) for s in ivf.shards)
    np.testing.assert_array_equal(c0, c1)
    _, want = flat.search(queries, 10)
    r = {p: recall(ivf.set_nprobe(p).search(queries, 10)[1], want) for p in (1, 8)}
    assert r[1] < 0.9 <= r[8] < 1.0  # the knob trades recall for speed
    d, i = ivf.set_nprobe(64).search(queries, 10)  # every list scanned: the flat form's exact answer
    np.testing.assert_array_equal(i, want)


def test_auto_nlist_is_near_sqrt_and_capped():
    assert auto_nlist(1_000_000) == 1024 and auto_nlist(10_000) == 128 and auto_nlist(1) == 1
    assert auto_nlist(10**9) == 1024


def test_config_selects_index_type_and_nprobe():
    assert load_config(CPU_YAML).retrieval.index_type == "sq_fp16"  # the paper's form stays the default
    r = load_config(CPU_YAML).retrieval
    assert (r.nprobe, r.recall_target) == ("auto", 0.95)  # the nprobe the index measured for this target
    with pytest.raises(ConfigError, match="nprobe"):
        load_config(None, retrieval={"nprobe": 0})
    r = load_config(None, retrieval={"index_type": "ivf", "nlist": 64, "nprobe": 8}).retrieval
    assert (r.index_type, r.nlist, r.nprobe) == ("ivf", 64, 8)
    with pytest.raises(ConfigError, match="index_type"):
        load_config(None, retrieval={"index_type": "hnsw"})


def test_the_job_builds_an_ivf_index_when_the_config_says_so(built_index, tmp_path):
    """The finished parts of the session's index, built again with ``index_type: ivf`` (no
    embedding: the retrieval settings do not change the parts)."""
    from canopy_ray.indexer import run_index
    from tests.index.conftest import CORPUS, index_config

    src, _ = built_index
    out = tmp_path / "ivf"
    shutil.copytree(src, out)
    cfg = index_config().override(retrieval={"index_type": "ivf", "nlist": 2, "nprobe": 2})
    summary = run_index(cfg, CORPUS, out, progress=False)
    assert summary["shards_computed"] == 0
    got = load_index(out, nprobe=cfg.retrieval.nprobe)
    assert got.manifest["index_type"] == "ivf" and got.manifest["nlist"] == 2
    assert all(isinstance(s, faiss.IndexIVF) and s.nprobe == 2 for s in got.shards.shards)
    ref = load_index(src)
    q = np.stack([ref.shards.shards[0].reconstruct(0)])
    assert got.search(q, 5) == ref.search(q, 5)  # nprobe = nlist: exactly the flat form's hits
