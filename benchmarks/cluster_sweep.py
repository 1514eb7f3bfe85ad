"""The sweep's autoscaling actor pool on several Ray nodes (docs/multi-node.md).

    python benchmarks/cluster_sweep.py [--out results/bench/cluster.md]

``canopy sweep`` (``jobs/sweep.py``) of a reader-free k x B grid on the bundled sample from a
driver joined to a head without CPUs and two worker nodes of 2 CPUs; its autoscaling Ray Data
actor pool (1..4 one-CPU actors) sampled every 2 s: live actors per node and points written. The
report and its other parts: ``benchmarks/cluster_report.py``.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

# a script's own folder (benchmarks/) is on the path, the repository root with tests.support is not
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cluster_report import ROOT, _s, main  # noqa: E402

from tests.support.local_cluster import LocalCluster  # noqa: E402

ALT = "the sweep's actor pool over time"
POINT_WORKER = "MapWorker(MapBatches(PointWorker))"  # Ray Data's name for the sweep's actors


def sweep_spec(work: Path, max_actors: int) -> Path:
    """A reader-free k x B grid of ``no_iteration`` on the bundled HotpotQA sample: 9 points of
    a few seconds each, so the pool has queued work to grow for and then runs out of it."""
    import yaml

    sample = ROOT / "canopy_ray" / "assets" / "sample"
    spec = {"config": str(ROOT / "configs" / "cpu.yaml"), "setting": "given", "questions": 12, "llm_cache": False,
            "work_dir": str(work / "data"),
            "datasets": {"sample": {"questions": str(sample / "questions.jsonl"),
                                    "corpus": str(sample / "corpus.jsonl")}},
            "grids": [{"methods": ["no_iteration"], "k": [4, 7, 10], "branching": [2, 3, 4], "reader": False}],
            "ablation": None, "pool": {"min_actors": 1, "max_actors": max_actors, "cpus_per_actor": 1}}
    path = work / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def measure(work: Path, max_actors: int = 4) -> dict:
    """``jobs/sweep.py`` from a driver joined to the cluster (two worker nodes of 2 CPUs: room for
    4 one-CPU actors); every 2 s the pool's live actors per node and the points written."""
    work.mkdir(parents=True, exist_ok=True)
    out = work / "out"
    samples = []
    with LocalCluster(workers=2, worker_cpus=2) as cluster:
        argv = [sys.executable, str(ROOT / "jobs" / "sweep.py"), "--spec", str(sweep_spec(work, max_actors)),
                "--out", str(out), "--no-report"]
        t0 = time.monotonic()
        with (work / "sweep.log").open("w") as f:
            proc = subprocess.Popen(argv, env=cluster.env, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
            while proc.poll() is None and time.monotonic() - t0 < 1200:
                try:
                    actors = cluster.actors_by_node(POINT_WORKER)
                except (RuntimeError, subprocess.TimeoutExpired, ValueError):
                    actors = None  # a slow `ray list`: no sample this time
                done = len(list((out / "points").rglob("*.json"))) if (out / "points").exists() else 0
                if actors is not None:
                    samples.append({"t": time.monotonic() - t0, "actors": actors, "points": done})
                time.sleep(2)
            if proc.poll() is None:
                proc.kill()
        rc = proc.wait()
    if rc != 0:
        raise RuntimeError(f"the sweep failed ({rc}):\n{(work / 'sweep.log').read_text()[-3000:]}")
    return {"points": len(list((out / "points").rglob("*.json"))), "wall_s": time.monotonic() - t0,
            "max_actors": max_actors, "samples": samples}


def table(r: dict) -> list[str]:
    counts = [sum(s["actors"].values()) for s in r["samples"]]
    peak = max(counts, default=0)
    nodes = sorted({n for s in r["samples"] for n in s["actors"]})
    first = next((s["t"] for s, c in zip(r["samples"], counts) if c == peak), None)
    start = next((c for c in counts if c), 0)
    end = "was released by the time the last point was written" if counts and counts[-1] == 0 else \
        f"held {counts[-1] if counts else 0} actors at the last sample"
    t = [s["t"] for s in r["samples"]]
    gaps = [b - a for a, b in zip(t, t[1:])]
    return ["### The sweep's autoscaling actor pool (`canopy sweep`, pool 1..{} one-CPU actors)".format(r["max_actors"]),
            "", f"{r['points']} points (a reader-free k x B grid on the bundled sample) in {r['wall_s']:.0f} s. "
            f"The pool grew from {start} to {peak} actors ({_s(first, '{:.0f}')} s after the start), on the nodes "
            f"{', '.join(nodes)}, while points were queued, and {end} "
            "(Ray Data's actor-pool autoscaler, its upscaling threshold set to 100% utilisation by "
            "`canopy_ray/eval/sweep.py`: grow while every actor is busy and points remain). Actors were "
            f"counted with `ray list actors`, {len(counts)} samples, a median {_s(statistics.median(gaps) if gaps else None, '{:.1f}')} s "
            "apart.", ""]


def plot(r: dict, path: Path) -> Path:
    from canopy_ray.plots import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    t = [s["t"] for s in r["samples"]]
    ax.step(t, [sum(s["actors"].values()) for s in r["samples"]], where="post", label="live actors")
    ax.set_xlabel("seconds since the sweep started")
    ax.set_ylabel("actors")
    ax2 = ax.twinx()
    ax2.plot(t, [s["points"] for s in r["samples"]], color="#55a868", label="points written")
    ax2.set_ylabel("points written")
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="lower right", fontsize=8)
    ax.set_title("canopy sweep: the autoscaling actor pool over two worker nodes", fontsize=10)
    return save(fig, path, 120)


if __name__ == "__main__":
    raise SystemExit(main("sweep", measure, __doc__))
