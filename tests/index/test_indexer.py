"""The Ray Data indexing job end to end: real local Ray, real FAISS, the packaged MiniLM.

One uninterrupted run is shared by the session (``conftest.built_index``). Resuming after a
real SIGKILL of the job (driver or one actor) is ``tests/jobs/test_kill.py``.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from canopy_ray.config import load_config
from canopy_ray.core.evidence import piece
from canopy_ray.index import load_index
from canopy_ray.index.job import IndexJobError
from canopy_ray.indexer import run_index
from tests.index.conftest import CORPUS, index_config as config

pytestmark = pytest.mark.integration

VALID = ["t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "tab0", "tab1", "img0", "vid0"]


@pytest.fixture(scope="module")
def full_run(built_index):
    return built_index


def test_bad_items_are_skipped_counted_and_listed(full_run):
    out, summary = full_run
    assert summary["items"] == 13 and summary["input_lines"] == 19
    assert summary["skipped_by_reason"] == {"bad_json": 1, "duplicate_id": 1, "empty_text": 1,
                                            "missing_id": 1, "ragged_table": 1, "unreadable_video": 1}
    assert summary["skipped"] == 6 and summary["duplicates"] == 1
    listed = [json.loads(x) for x in (out / "skipped.jsonl").read_text().splitlines()]
    assert [(s["line"], s["reason"]) for s in listed] == [
        (14, "bad_json"), (15, "empty_text"), (16, "ragged_table"), (17, "unreadable_video"),
        (18, "duplicate_id"), (20, "missing_id")]  # line 19 is blank
    assert json.loads((out / "report.json").read_text())["by_reason"] == summary["skipped_by_reason"]


def test_index_holds_every_valid_item_once_and_searches(full_run):
    out, summary = full_run
    index = load_index(out)
    assert index.ids == VALID
    m = index.manifest
    assert m["model_id"] == "all-MiniLM-L6-v2" and m["dim"] == 384 and m["count"] == 13
    assert m["adapter_id"] == "frozen" and m["index_type"] == "sq_fp16" and len(m["checksum"]) == 64
    assert sorted(p.name for p in out.glob("*.faiss")) == ["shard-000.faiss", "shard-001.faiss", "shard-002.faiss"]
    assert summary["nodes"] == index.nodes.n_nodes == m["nodes"]
    from canopy_ray.models.encoder import TextEncoder

    enc = TextEncoder()
    hits = index.search(enc.encode_queries(["Which planet has 95 moons?", "When did the Berlin Wall fall?"]), 3)
    assert hits[0][0][0] == "tab0" and hits[1][0][0] == "t1"
    assert index.item("t1").title == "Berlin"  # the first t1, not the duplicate
    # Cached node vectors are f_theta of each node: equal to encoding on the fly (fp16 storage).
    from canopy_ray.core.hierarchy import build_tree

    for item_id in ("t6", "tab0", "vid0"):
        tree = build_tree(index.item(item_id))
        assert index.nodes.usable_for(enc)
        cached = index.nodes.lookup(item_id)
        cached = np.stack([cached[n.span] for n in tree.nodes()])
        fresh = enc.encode_nodes([piece(tree, [n.span])
                                  for n in tree.nodes()])
        np.testing.assert_allclose(cached, fresh, atol=2e-3)
    assert Path(index.item("vid0").path).is_absolute()


def test_rerun_of_a_finished_index_recomputes_nothing(full_run):
    out, _ = full_run
    summary = run_index(config(), CORPUS, out, progress=False)
    assert summary["shards_computed"] == 0 and summary["shards_resumed"] == 5 and summary["items"] == 13


def test_a_grown_corpus_embeds_only_its_changed_shards(full_run, minilm, tmp_path):
    """The corpus file first holds its first 10 lines (input shards of 4, 4, 2), then all of
    them: the two whole shards are kept, the rest embedded, the 2-line shard's part dropped,
    and the index equals one built from the whole corpus at once."""
    ref_out, ref = full_run
    corpus = tmp_path / "corpus.jsonl"
    lines = CORPUS.read_text().splitlines(keepends=True)
    corpus.write_text("".join(lines[:10]))
    out = tmp_path / "index"
    first = run_index(config(), corpus, out, media_root=CORPUS.parent, progress=False)
    assert first["items"] == 10 and first["shards_computed"] == 3
    old_parts = sorted((out / "work" / "parts").glob("part-*.parquet"))
    corpus.write_text("".join(lines))
    grown = run_index(config(), corpus, out, media_root=CORPUS.parent, progress=False)
    assert grown["shards_resumed"] == 2 and grown["shards_computed"] == 3 and grown["rows_computed"] == 11
    parts = sorted((out / "work" / "parts").glob("part-*.parquet"))
    assert len(parts) == 5 and len(set(old_parts) & set(parts)) == 2
    assert {k: grown[k] for k in ("items", "nodes", "skipped_by_reason")} == \
        {k: ref[k] for k in ("items", "nodes", "skipped_by_reason")}
    got, want = load_index(out), load_index(ref_out)
    assert got.ids == want.ids
    for item_id in want.ids:  # node vectors by span
        mine, theirs = got.nodes.lookup(item_id), want.nodes.lookup(item_id)
        assert mine.keys() == theirs.keys()
        for span, vec in theirs.items():
            np.testing.assert_allclose(mine[span], vec, atol=1e-3)
    q = minilm.encode_queries(["Which planet has 95 moons?"])
    (hits,), (ref_hits,) = got.search(q, 13), want.search(q, 13)
    assert [h[0] for h in hits] == [h[0] for h in ref_hits]
    np.testing.assert_allclose([h[1] for h in hits], [h[1] for h in ref_hits], atol=1e-3)
    with pytest.raises(IndexJobError, match="another corpus path"):  # not an update: another corpus
        run_index(config(), CORPUS, out, progress=False)


def test_changed_settings_are_refused_without_overwrite(full_run, monkeypatch):
    out, _ = full_run
    changed = load_config(None, hierarchy={"branching": 3}, index={"shard_items": 4})
    with pytest.raises(IndexJobError, match="other settings"):
        run_index(changed, CORPUS, out, progress=False)
    # the same config, but node text rendered another way: the stored node vectors are stale
    monkeypatch.setattr("canopy_ray.core.evidence.NODE_TEXT_VERSION", 3)
    with pytest.raises(IndexJobError, match="other settings"):
        run_index(config(), CORPUS, out, progress=False)
