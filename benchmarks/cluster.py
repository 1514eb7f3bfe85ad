"""The engine on several Ray nodes, with real node loss (docs/multi-node.md).

    python benchmarks/cluster.py [--parts index] [--items 600] [--out results/bench/cluster.md]

Every part runs on a :class:`local_cluster.LocalCluster` on 127.0.0.1: a head without CPUs and
two worker nodes of 2 CPUs, token authentication on. A node is lost by SIGKILL of every process
of its ``ray start`` session (raylet, agents, the worker processes of its tasks and actors).

- ``index``: the index job (``jobs/index.py``, 2 embedding actors: Ray Data spreads them one per
  worker node) over ``--items`` synthetic text items, once uninterrupted and once with worker-1
  killed when a quarter of the input shards are on disk. The interrupted job finishes by itself
  (Ray Data restarts the lost actor on the surviving node and retries its slices) or, if it
  fails, the same command again resumes it. Its index must equal the uninterrupted run's; the
  table gives both wall times and what the loss cost.

The run's own numbers only: wall times are compared within one run (other work shares the CPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_cluster import LocalCluster  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EMBEDDER = "MapWorker(MapBatches(SliceEmbedder))"  # the class name Ray Data gives the index job's actors

WORDS = ("river", "castle", "engine", "harbour", "library", "orchard", "glacier", "market", "bridge", "tower",
         "forest", "canal", "theatre", "mine", "lighthouse", "village", "railway", "garden", "palace", "school")


def text_corpus(path: Path, n: int) -> Path:
    """``n`` distinct text items (3 to 6 sentences each, deterministic) and one line repeating
    the first id (the job keeps the first): the index must hold each id exactly once."""
    lines = []
    for i in range(n):
        a, b, c = WORDS[i % 20], WORDS[(i // 20) % 20], WORDS[(i * 7 + 3) % 20]
        sentences = [f"The {a} of {b}ford was finished in {1700 + i % 300}.",
                     f"It stands {10 + i % 90} metres from the old {c}.",
                     f"Visitors reach it by the {b} road in about {5 + i % 55} minutes.",
                     f"Record {i} says the {a} was restored by builder {i * 13 % 97}.",
                     f"Its keeper lists {i % 11} rooms and {i % 7} stairs.",
                     f"The {c} beside it closed in {1800 + i % 200}."][: 3 + i % 4]
        lines.append({"id": f"syn{i:05d}", "modality": "text", "title": f"{a.title()} of {b.title()}ford {i}",
                      "sentences": sentences})
    lines.append(dict(lines[0], title="a later copy of the first item"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(o) + "\n" for o in lines))
    return path


def index_argv(corpus: Path, out: Path, actors: int = 2, shard_items: int = 20) -> list[str]:
    return [sys.executable, str(ROOT / "jobs" / "index.py"), "--config", str(ROOT / "configs" / "cpu.yaml"),
            "--corpus", str(corpus), "--out", str(out), "--actors", str(actors), "--shard-items", str(shard_items),
            "--no-progress"]


def parts_done(out: Path) -> int:
    d = out / "work" / "parts"
    return len(list(d.glob("part-*.parquet"))) if d.exists() else 0


def summary_of(log: Path) -> dict:
    return json.loads(log.read_text().strip().splitlines()[-1])


def run_index_job(cluster: LocalCluster, argv: list[str], log: Path, timeout: float = 600) -> tuple[int, float]:
    """The job's driver joined to ``cluster`` (``RAY_ADDRESS`` and the token); its exit code and wall time."""
    t0 = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.run(argv, env=cluster.env, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                            timeout=timeout).returncode
    return rc, time.perf_counter() - t0


def index_with_node_loss(cluster: LocalCluster, argv: list[str], out: Path, log: Path, victim: str = "worker-1",
                         at_fraction: float = 0.25, n_shards: int | None = None, timeout: float = 600) -> dict:
    """``argv`` (the index job) with node ``victim`` SIGKILLed once ``at_fraction`` of the input
    shards are on disk (and an embedding actor's process runs on the victim). If the job then fails,
    the same command is run again (a resubmission resumes from the finished shards). Times
    and what happened, for the table and the test."""
    t0 = time.perf_counter()
    f = log.open("w")
    proc = subprocess.Popen(argv, env=cluster.env, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    at: dict = {"victim": victim}
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the job ended ({proc.returncode}) before the kill:\n{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("the job did not reach the kill point in time")
            n = n_shards or _planned_shards(out)
            if n and parts_done(out) >= max(1, int(n * at_fraction)):
                running = cluster.running("SliceEmbedder")
                if running.get(victim):
                    break
            time.sleep(0.1)
        at["parts_at_kill"], at["shards"], at["embedders_at_kill"] = parts_done(out), n, running
        at["kill_s"] = time.perf_counter() - t0
        at["killed"] = cluster.kill(victim)
        at["left_after_kill"] = cluster.left(victim, 10)
        at["marked_dead_s"] = cluster.wait_dead(victim, 120)
        rc = proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        f.close()
    at["first_rc"] = rc
    at["first_s"] = time.perf_counter() - t0
    at["resubmitted"] = rc != 0
    if rc != 0:
        rc, _ = run_index_job(cluster, argv, log.with_suffix(".rerun.log"), timeout)
        log = log.with_suffix(".rerun.log")
    at["rc"], at["total_s"] = rc, time.perf_counter() - t0
    at["summary"] = summary_of(log) if rc == 0 else None
    at["log"] = str(log)
    return at


def _planned_shards(out: Path) -> int | None:
    try:
        return len(json.loads((out / "work" / "plan.json").read_text())["shard_rows"])
    except (OSError, ValueError, KeyError):
        return None


# ---------------------------------------------------------------- the benchmark

def index_part(work: Path, items: int) -> dict:
    corpus = text_corpus(work / "corpus.jsonl", items)
    with LocalCluster(workers=2, worker_cpus=2) as cluster:
        ref_out, lost_out = work / "ref", work / "lost"
        rc, ref_s = run_index_job(cluster, index_argv(corpus, ref_out), work / "ref.log")
        assert rc == 0, (work / "ref.log").read_text()[-3000:]
        placement = cluster.actors_by_node(EMBEDDER, state=None)
        lost = index_with_node_loss(cluster, index_argv(corpus, lost_out), lost_out, work / "lost.log")
        after = cluster.actors_by_node(EMBEDDER, state=None)
    same = same_index(lost_out, ref_out)
    return {"items": items, "ref_s": ref_s, "placement": placement, "placement_after": after, **lost,
            "same_index": same, "ref_summary": summary_of(work / "ref.log")}


def same_index(out: Path, ref: Path, tol: float = 1e-3) -> dict:
    """What an interrupted run's index shares with an uninterrupted one's: ids (each once),
    item and node vectors within ``tol``, and the manifest's checksums."""
    import numpy as np

    from canopy_ray.index import load_index

    got, want = load_index(out, verify=True), load_index(ref, verify=True)

    def vecs(ix):
        return np.concatenate([s.reconstruct_n(0, s.ntotal) for s in ix.shards.shards])

    def checksums(ix):  # the FAISS shards', the item table's, the node store's, and the one over them
        m = ix.manifest
        return [s["sha256"] for s in m["shards"]], m["files"], m["checksum"]

    return {"ids_equal": got.ids == want.ids, "ids_unique": len(set(got.ids)) == len(got.ids),
            "count": got.count,
            "max_item_diff": float(np.abs(vecs(got) - vecs(want)).max()),
            "max_node_diff": float(np.abs(np.load(out / "nodes.f16.npy").astype(np.float32)
                                          - np.load(ref / "nodes.f16.npy").astype(np.float32)).max()),
            "checksums_equal": checksums(got) == checksums(want)}


def main(argv=None) -> int:
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="index")
    p.add_argument("--items", type=int, default=600, help="text items of the index part")
    p.add_argument("--out", default=None, help="also write the tables to this markdown file")
    args = p.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="canopy-cluster-") as tmp:
        if "index" in args.parts:
            results["index"] = index_part(Path(tmp) / "index", args.items)
            print(json.dumps(results["index"], indent=1, default=str), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
