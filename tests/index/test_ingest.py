"""The index job's actor (SliceEmbedder) reads, validates and embeds a slice of an input shard
exactly as validation followed by NodeEmbedder does over the same rows; no Ray."""

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from canopy_ray.config import load_config
from canopy_ray.index.ingest import NodeEmbedder, SliceEmbedder, corpus_files, split_corpus, validate_batch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "index"
VECTORS = ("node_vecs", "item_vec")


def test_slice_embedder_equals_validation_then_node_embedder(minilm, tmp_path):
    rows, keys = split_corpus(corpus_files(FIXTURES / "corpus.jsonl"), tmp_path, 100)
    assert rows == [19] and len(keys) == 1
    shard = tmp_path / "shard-00000.parquet"
    cfg = load_config(None)
    actor = SliceEmbedder(cfg.models, cfg.hierarchy, media_root=str(FIXTURES), batch_items=4, encoder=minilm)
    # rows 8..18: text, tables, image, video and every kind of bad line
    out = list(actor({"file": np.array([str(shard)], dtype=object), "start": np.array([8]),
                      "stop": np.array([19])}))
    assert [len(b["row"]) for b in out] == [4, 4, 3]  # batches of at most batch_items rows
    got = {k: np.concatenate([b[k] for b in out]) for k in out[0]}
    assert got["row"].tolist() == list(range(8, 19))

    table = pq.read_table(shard).slice(8, 11)
    rows = validate_batch({c: table.column(c).to_numpy(zero_copy_only=False)
                           for c in ("shard", "row", "file", "line", "raw")}, str(FIXTURES))
    want = NodeEmbedder(cfg.models, cfg.hierarchy, encoder=minilm)(rows)
    assert set(got) == set(want)
    assert sorted(r for r in want["reason"] if r) == ["bad_json", "empty_text", "missing_id", "ragged_table",
                                                       "unreadable_video"]
    for k in set(want) - set(VECTORS):
        assert got[k].tolist() == want[k].tolist(), k
    for k, dtype in zip(VECTORS, (np.float16, np.float32)):  # other batches: equal to float noise
        for a, b in zip(got[k], want[k]):
            np.testing.assert_allclose(np.frombuffer(a, dtype).astype(np.float32),
                                       np.frombuffer(b, dtype).astype(np.float32), atol=2e-3)
