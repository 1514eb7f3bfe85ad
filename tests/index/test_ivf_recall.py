"""An ivf index measures its own recall: at indexing, recall@10 against exact search on a seeded
sample of its own vectors, the smallest nprobe reaching ``retrieval.recall_target``, both kept in
the manifest; a load with ``nprobe: auto`` searches with that nprobe. The recall is recomputed
here with FAISS's exact ``IndexFlatIP`` over the vectors the job embedded."""

import json
import shutil

import faiss
import numpy as np
import pyarrow.parquet as pq
import pytest

from canopy_ray.index import load_index, load_shard
from canopy_ray.index.manifest import IVF_RECALL, read_manifest, search_nprobe
from canopy_ray.index.shards import RecallProbe, ShardedIndex, sample_rows


def unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def clustered(n, seed, dim=32, clusters=20):
    r = np.random.default_rng(seed)
    centres = r.standard_normal((clusters, dim))
    return unit(centres[r.integers(0, clusters, n)] + 0.5 * r.standard_normal((n, dim)))


def own_recall(index_search, vectors, rows, k=10):
    """recall@k of ``index_search`` over each sampled row's k nearest other rows, exact by IndexFlatIP."""
    flat = faiss.IndexFlatIP(vectors.shape[1])
    flat.add(vectors)
    exact = flat.search(vectors[rows], k + 1)[1]
    found = index_search(vectors[rows], k + 1)
    hits = [len(set(f[f != r][:k]) & set(e[e != r][:k])) / k for f, e, r in zip(found, exact, rows)]
    return float(np.mean(hits))


def test_the_probe_streams_to_the_exact_neighbours():
    x = clustered(3000, 0)
    rows = RecallProbe.rows_for(len(x))
    probe = RecallProbe(rows, x[rows], 0.9)
    for a in range(0, len(x), 700):  # rows arriving in chunks, as the writer gets them
        probe.add(x[a:a + 700], a)
    flat = faiss.IndexFlatIP(x.shape[1])
    flat.add(x)
    np.testing.assert_array_equal(probe._positions, flat.search(x[rows], 11)[1])


def test_build_chooses_the_smallest_nprobe_that_reaches_the_target():
    x = clustered(6000, 1)
    index = ShardedIndex.build(x, 2, "ivf", nlist=64, recall_target=0.95)
    got = index.ivf_recall
    p = got["nprobe"]
    assert got["target"] == 0.95 and 1 < p < 64 and all(s.nprobe == p for s in index.shards)
    rows = sample_rows(len(x), got["queries"], got["seed"])
    at = lambda n: own_recall(lambda q, k: index.set_nprobe(n).search(q, k)[1], x, rows)  # noqa: E731
    assert at(p) == pytest.approx(got["recall"], abs=1e-4) and at(p) >= 0.95
    assert at(p - 1) < 0.95  # one list fewer misses the target: p is the smallest


def test_auto_is_the_measured_nprobe_and_a_number_wins():
    m = {"index_type": "ivf", "nlist": 64, IVF_RECALL: {"nprobe": 7}}
    assert search_nprobe(m, "auto") == 7 and search_nprobe(m, 3) == 3
    assert search_nprobe({"index_type": "ivf", "nlist": 64}, "auto") == 64  # unmeasured: every list, exact
    assert search_nprobe({"index_type": "sq_fp16"}, "auto") is None and search_nprobe({"index_type": "flat"}, 5) is None


TOPICS = [["river", "boat", "fish", "water", "bridge", "bank", "current", "shore"],
          ["guitar", "drum", "song", "concert", "melody", "band", "chord", "stage"],
          ["election", "vote", "senate", "party", "law", "minister", "campaign", "ballot"],
          ["protein", "cell", "enzyme", "gene", "membrane", "molecule", "virus", "tissue"],
          ["goal", "striker", "league", "match", "referee", "stadium", "season", "coach"],
          ["revenue", "profit", "dividend", "shares", "quarter", "margin", "debt", "audit"],
          ["volcano", "lava", "crater", "eruption", "magma", "ash", "summit", "quake"],
          ["novel", "poet", "chapter", "author", "verse", "publisher", "fiction", "library"],
          ["engine", "piston", "fuel", "gearbox", "exhaust", "torque", "brake", "wheel"],
          ["recipe", "flour", "butter", "oven", "sugar", "dough", "bakery", "pastry"]]


def clustered_corpus(path, n, seed=0):
    """``n`` one-sentence text items, each drawn from one of ten topics' words: MiniLM puts
    them in clusters (one per topic) with spread inside each."""
    r = np.random.default_rng(seed)
    with path.open("w") as f:
        for i in range(n):
            words = list(r.choice(TOPICS[i % len(TOPICS)], 5, replace=False))
            words += list(r.choice(TOPICS[r.integers(len(TOPICS))], 1))  # a stray word from anywhere
            f.write(json.dumps({"id": f"t{i}", "modality": "text",
                                "text": f"Item {i} is about the {' and the '.join(words)}."}) + "\n")


def job_vectors(out):
    """The item vectors the job embedded, in index order (no line was skipped: every row kept)."""
    plan = json.loads((out / "work" / "plan.json").read_text())
    parts = [pq.read_table(out / "work" / "parts" / f"part-{key}.parquet", columns=["item_vec"])
             for key in plan["shard_keys"]]
    return np.stack([np.frombuffer(v, np.float32) for t in parts for v in t.column("item_vec").to_pylist()])


@pytest.mark.integration
def test_the_index_job_records_its_recall_and_a_search_reaches_it(ray_local, tmp_path):
    from canopy_ray.index.job import format_summary
    from canopy_ray.indexer import run_index
    from tests.index.conftest import index_config

    corpus, out = tmp_path / "corpus.jsonl", tmp_path / "index"
    clustered_corpus(corpus, 800)
    cfg = index_config(shard_items=200, batch_items=64).override(
        retrieval={"index_type": "ivf", "nlist": 16, "shards": 2, "recall_target": 0.97})
    summary = run_index(cfg, corpus, out, progress=False)
    assert summary["items"] == 800 and summary["skipped"] == 0
    got = read_manifest(out)[IVF_RECALL]
    assert (got["target"], got["k"]) == (0.97, 10) and got["recall"] >= 0.97 and got["queries"] == 300
    assert summary["ivf_recall"] == got and f"at nprobe {got['nprobe']}, the smallest reaching 0.97" in \
        format_summary(summary)  # what `canopy index` prints

    index = load_index(out)  # nprobe: auto, the config's default
    p = got["nprobe"]
    assert all(s.nprobe == p for s in index.shards.shards)
    assert all(s.nprobe == p for s in load_shard(out, 1, nprobe=cfg.retrieval.nprobe).shards)  # a Serve shard replica
    x = job_vectors(out)
    rows = sample_rows(len(x), got["queries"], got["seed"])
    recall = own_recall(lambda q, k: index.shards.search(q, k)[1], x, rows)
    assert recall == pytest.approx(got["recall"], abs=1e-4) and recall >= 0.97
    assert p > 1  # the clusters overlap: one list is not enough, and p is the smallest that is
    assert own_recall(lambda q, k: index.shards.set_nprobe(p - 1).search(q, k)[1], x, rows) < 0.97
    # a number in the config wins over the measured value
    assert all(s.nprobe == 1 for s in load_index(out, nprobe=cfg.override(retrieval={"nprobe": 1})
                                                 .retrieval.nprobe).shards.shards)
    # rebuilt with another target from the same parts (no embedding): measured again
    again = tmp_path / "again"
    shutil.copytree(out, again)
    run_index(cfg.override(retrieval={"recall_target": 0.5}), corpus, again, progress=False)
    low = read_manifest(again)[IVF_RECALL]
    assert low["target"] == 0.5 and low["nprobe"] < p and low["recall"] >= 0.5


def test_an_ivf_writer_needs_its_recall_probe(tmp_path):
    from canopy_ray.index.writer import IndexWriter

    x = clustered(200, 2)
    with pytest.raises(ValueError, match="recall"):
        IndexWriter(tmp_path, count=200, dim=32, index_type="ivf", sample=x, nlist=4)
