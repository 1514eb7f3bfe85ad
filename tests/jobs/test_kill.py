"""Kill -9 during the index job: the real job as a user starts it
(``python jobs/index.py``, its own local Ray), sent real SIGKILLs.

- The driver's process group killed when some but not all input shards are on disk: the
  job's Ray workers go too, and the same command again finishes the index.
- One ``SliceEmbedder`` actor killed mid-run: Ray Data restarts it and retries its slice
  (its actor pools default to ``max_restarts=-1``, ``max_task_retries=-1``), so the run
  finishes by itself.

Either way every valid item is indexed exactly once, the skipped lines are counted as in an
uninterrupted run, and every vector equals that run's to 1e-3 (fp16 storage: one fp16 step
near 1.0 is 4.9e-4; embeddings of the same slices are otherwise bit-identical on CPU).
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from canopy_ray.index import load_index
from tests.jobs.processes import KillableJob

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "index" / "corpus.jsonl"
N_SHARDS = 10  # 19 lines, 2 per input shard (the unit of resume)
TOL = 1e-3


def job_argv(out: Path) -> list[str]:
    return [sys.executable, str(ROOT / "jobs" / "index.py"), "--config", str(ROOT / "configs" / "cpu.yaml"),
            "--corpus", str(CORPUS), "--out", str(out), "--num-cpus", "2", "--actors", "1",
            "--shard-items", "2", "--no-progress"]


def run_job(out: Path, log: Path) -> dict:
    """The job to the end; its summary (the last line it prints)."""
    with KillableJob(job_argv(out), log) as job:
        rc = job.wait(300)
        assert rc == 0, job.tail()
        assert job.left_after(30) == []
    return json.loads(log.read_text().strip().splitlines()[-1])


def parts(out: Path) -> dict[str, int]:
    d = out / "work" / "parts"
    return {p.name: p.stat().st_mtime_ns for p in d.glob("part-*.parquet")} if d.exists() else {}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of the same command."""
    out = tmp_path_factory.mktemp("ref") / "index"
    return out, run_job(out, out.parent / "log")


def item_vectors(index) -> np.ndarray:
    return np.concatenate([s.reconstruct_n(0, s.ntotal)
                           for s in index.shards.shards])


def assert_same_index(out: Path, ref: Path, summary: dict, ref_summary: dict) -> None:
    got, want = load_index(out, verify=True), load_index(ref)  # verify: every shard checksum holds
    assert len(set(got.ids)) == len(got.ids) == got.count == 13  # each valid item exactly once
    assert got.ids == want.ids
    for key in ("items", "nodes", "skipped", "skipped_by_reason", "duplicates", "input_lines"):
        assert summary[key] == ref_summary[key], key
    assert (out / "skipped.jsonl").read_text() == (ref / "skipped.jsonl").read_text()
    np.testing.assert_allclose(item_vectors(got), item_vectors(want), atol=TOL)
    node_items = pq.read_table(out / "node_items.parquet").to_pydict()
    assert node_items == pq.read_table(ref / "node_items.parquet").to_pydict()
    assert node_items["item_id"] == got.ids  # one node entry per item, none twice
    np.testing.assert_array_equal(np.load(out / "node_spans.npy"), np.load(ref / "node_spans.npy"))
    np.testing.assert_allclose(np.load(out / "nodes.f16.npy").astype(np.float32),
                               np.load(ref / "nodes.f16.npy").astype(np.float32), atol=TOL)
    m, w = got.manifest, want.manifest
    assert {k: m[k] for k in ("count", "nodes", "dim", "model_id", "adapter_id")} == \
           {k: w[k] for k in ("count", "nodes", "dim", "model_id", "adapter_id")}


def test_driver_killed_then_rerun(reference, tmp_path):
    out = tmp_path / "index"
    with KillableJob(job_argv(out), tmp_path / "killed.log") as job:
        job.wait_for(lambda: len(parts(out)) >= 1, 240, "finished input shard")
        job.kill_group()
        assert job.left_after(60) == [], "Ray processes of the killed job are still running"
    done = parts(out)
    assert 1 <= len(done) < N_SHARDS, f"killed after {len(done)} of {N_SHARDS} input shards"
    assert not (out / "manifest.json").exists()  # never mistaken for a finished index

    summary = run_job(out, tmp_path / "rerun.log")
    assert summary["shards_resumed"] == len(done) and summary["shards_computed"] == N_SHARDS - len(done)
    assert {k: v for k, v in parts(out).items() if k in done} == done  # finished shards kept as they were
    assert_same_index(out, reference[0], summary, reference[1])


def test_actor_killed_mid_run(reference, tmp_path):
    out = tmp_path / "index"
    with KillableJob(job_argv(out), tmp_path / "job.log") as job:
        job.wait_for(lambda: len(parts(out)) >= 1, 240, "finished input shard")
        (actor,) = job.find("SliceEmbedder")  # ray::MapWorker(MapBatches(SliceEmbedder)), the pool's one actor
        killed, at_kill = actor.pid, len(parts(out))
        os.kill(killed, 9)
        job.wait_for(lambda: any(p.pid != killed for p in job.find("SliceEmbedder")), 120, "restarted actor")
        assert job.wait(300) == 0, job.tail()
        assert job.left_after(30) == []
    assert at_kill < N_SHARDS, "the actor was killed after the last input shard"
    summary = json.loads((tmp_path / "job.log").read_text().strip().splitlines()[-1])
    assert summary["shards_computed"] == N_SHARDS and summary["rows_computed"] == 19  # no slice counted twice
    assert_same_index(out, reference[0], summary, reference[1])
