"""The engine on several Ray nodes, with real node loss (docs/multi-node.md).

    python benchmarks/cluster.py [--parts index,serve,autoscale] [--items 600] [--out results/bench/cluster.md]

Every part runs on a :class:`local_cluster.LocalCluster` on 127.0.0.1: a head without CPUs and
two worker nodes of 2 CPUs, token authentication on. A node is lost by SIGKILL of every process
of its ``ray start`` session (raylet, agents, the worker processes of its tasks and actors).

- ``index``: the index job (``jobs/index.py``, 2 embedding actors: Ray Data spreads them one per
  worker node) over ``--items`` synthetic text items, once uninterrupted and once with worker-1
  killed when a quarter of the input shards are on disk. The interrupted job finishes by itself
  (Ray Data restarts the lost actor on the surviving node and retries its slices) or, if it
  fails, the same command again resumes it. Its index must equal the uninterrupted run's; the
  table gives both wall times and what the loss cost.
- ``serve``: the application (configs/cpu.yaml's, no LLM) by ``serve deploy``, two replicas of
  each model deployment on the workers and the Ingress beside the proxy on the head
  (:func:`serve_yaml`); distinct /v1/compress requests at concurrency 4, the worker holding the
  most replicas SIGKILLed after 20 s. Per second: answered and failed requests, p99; when the
  GCS marked the node dead, when a request succeeded again, when every model deployment was back
  to two replicas.
- ``autoscale``: ``configs/serve-cluster.yaml`` as committed (autoscaling 2..N replicas) under a
  load ramp (:data:`RAMP`); replicas per deployment (``serve status`` every 2 s), answered req/s
  and p50/p99 over time. On 2 shared cores more replicas cannot add throughput: the figure shows
  the autoscaler's decisions and what latency does meanwhile.

- ``train``: f_theta trained on the bundled HotpotQA sample with configs/cpu.yaml's recipe (no
  dropout) on three worker nodes of 1 CPU (one Train worker per node): 1 worker, 2 data-parallel
  workers, and 2 workers again with the node of one of them SIGKILLed after the first checkpoint
  (Ray Train restarts both on the nodes left, from that checkpoint); the validation decision
  accuracy at every second step of each run, and what the loss cost in wall time.
- ``sweep``: ``canopy sweep`` (``jobs/sweep.py``) of a reader-free k x B grid on the bundled sample
  from a driver joined to the cluster; its autoscaling Ray Data actor pool (1..4 one-CPU actors)
  sampled every 2 s: live actors per node and points written.

``--out`` also keeps the raw results as JSON beside the report, so a part can be run again alone
(``--parts serve``) and the report redrawn with the others kept.

The run's own numbers only: wall times are compared within one run (other work shares the CPUs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_cluster import LocalCluster, free_ports  # noqa: E402

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
    """The index job's summary: its last JSON line (Ray may log a line or two after it)."""
    for line in reversed(log.read_text().strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError(f"no summary line in {log}")


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


# ---------------------------------------------------------------- Serve across nodes

SERVE = str(Path(sys.executable).parent / "serve")
SPREAD = ("QueryEncoder", "NodeEncoder", "Refiner")  # the model deployments, 2 replicas each on the workers


def serve_yaml(work: Path, port: int, replicas: int = 2) -> Path:
    """A Serve config for ``serve deploy``: configs/cpu.yaml's application without an LLM
    (/v1/compress needs none) and with a NodeEncoder deployment, ``replicas`` replicas of each
    model deployment, and the Ingress beside the HTTP proxy on the head (it asks for the head's
    ``ingress`` resource and no CPU), so that losing a worker never takes the replica that answers
    HTTP: every request then gets JSON, a 200 or a 5xx with a reason."""
    import yaml

    cfg = yaml.safe_load((ROOT / "configs" / "cpu.yaml").read_text())
    cfg["llm"] = {"backend": "openai", "url": "http://127.0.0.1:9/v1", "model": "unused"}
    cfg["serve"]["node_encoder"] = "deployment"  # as configs/serve-cluster.yaml: encoders scaled apart
    (work / "canopy.yaml").write_text(yaml.safe_dump(cfg))
    app = {"name": "canopy", "route_prefix": "/", "import_path": "canopy_ray.serve:build_app",
           "args": {"config": str(work / "canopy.yaml")},
           "deployments": [{"name": "Ingress", "num_replicas": 1,
                            "ray_actor_options": {"num_cpus": 0, "resources": {"ingress": 1}}},
                           *({"name": d, "num_replicas": replicas} for d in SPREAD),
                           {"name": "Retriever", "num_replicas": 1}]}
    path = work / "serve.yaml"
    path.write_text(yaml.safe_dump({"proxy_location": "HeadOnly", "http_options": {"host": "127.0.0.1", "port": port},
                                    "applications": [app]}))
    return path


def serve_deploy(cluster: LocalCluster, config: Path, url: str, timeout: float = 400) -> float:
    """``serve deploy`` to the cluster, then wait for /healthz and every replica; seconds taken."""
    import httpx

    t0 = time.perf_counter()
    out = subprocess.run([SERVE, "deploy", str(config), "-a", cluster.dashboard_url], env=cluster.env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"serve deploy failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=10).status_code == 200 and \
                    running(app_status(cluster)):
                return time.perf_counter() - t0
        except (httpx.HTTPError, RuntimeError, KeyError, TypeError, subprocess.TimeoutExpired):
            pass
        time.sleep(2)
    raise RuntimeError(f"the application was not running within {timeout} s: {app_status(cluster)}")


def app_status(cluster: LocalCluster) -> dict[str, str]:
    """``serve status``: the application's and each deployment's status."""
    import yaml

    out = subprocess.run([SERVE, "status", "-a", cluster.dashboard_url], env=cluster.env, capture_output=True,
                         text=True, timeout=60)
    app = yaml.safe_load(out.stdout)["applications"]["canopy"]
    return {"app": app["status"], **{name: d["status"] for name, d in app["deployments"].items()}}


def running(status: dict[str, str]) -> bool:
    return status.pop("app") == "RUNNING" and all(v == "HEALTHY" for v in status.values())


def replicas_by_node(cluster: LocalCluster) -> dict[str, dict[str, int]]:
    """Live replicas of each deployment per node (``ray list actors``)."""
    out: dict[str, dict[str, int]] = {}
    for a in cluster.list_actors(state="ALIVE"):
        if a["class_name"].startswith("ServeReplica:canopy:"):
            d = a["class_name"].split(":")[-1]
            out.setdefault(d, {})
            out[d][a["node"]] = out[d].get(a["node"], 0) + 1
    return out


def busiest_worker(placed: dict[str, dict[str, int]]) -> str:
    """The worker holding the most model replicas (worker-1 on a tie). Ray's SPREAD is soft: a
    deployment may start with both replicas on one worker, so the node to lose is chosen from
    where the replicas are, and losing it always takes replicas with it."""
    held = Counter()
    for d in SPREAD:
        held.update(placed.get(d, {}))
    return max(sorted(held), key=held.__getitem__)


def compress_body(i: int) -> str:
    """A distinct /v1/compress request (no cache holds its nodes: the NodeEncoder must encode)."""
    return json.dumps({"query": f"When was tower {i} built?", "items": [
        {"id": "p", "modality": "text", "title": f"Tower {i}",
         "sentences": [f"Tower {i} stands in town {i}.", f"It was built in {1800 + i % 200}.",
                       f"It is {100 + i % 300} metres tall.", "Visitors climb it every day.",
                       f"Its architect was Builder {i}."]}]})


async def serve_with_node_loss(cluster: LocalCluster, url: str, concurrency: int = 4, before_s: float = 20,
                               after_full_s: float = 15, victim: str = "worker-1", hang_s: float = 120,
                               limit_s: float = 240, replicas: int = 2) -> tuple[list, dict]:
    """Requests at ``concurrency`` for ``before_s``, then node ``victim`` SIGKILLed, and load
    until ``after_full_s`` after full service returned (every model deployment back to
    ``replicas`` live replicas, none on the victim) or ``limit_s``. The replies and times:
    ``kill`` (perf_counter), ``dead_s`` (the GCS marked the node dead), ``first_ok_s`` (a request
    sent after the kill succeeded), ``full_s``."""
    import httpx

    from faults import send

    at: dict = {"victim": victim}
    replies: list = []
    stop = asyncio.Event()
    count = iter(range(10**9))

    async def worker(client):
        while not stop.is_set():
            replies.append(await send(client, url + "/v1/compress", compress_body(next(count)), hang_s))

    def full() -> bool:
        placed = replicas_by_node(cluster)
        return all(sum(n for node, n in placed.get(d, {}).items() if node != victim) >= replicas
                   and victim not in placed.get(d, {}) for d in SPREAD)

    async def watch():
        await asyncio.sleep(before_s)
        at["kill"] = time.perf_counter()
        at["before"] = len(replies)
        at["killed"] = await asyncio.to_thread(cluster.kill, victim)
        dead = asyncio.create_task(asyncio.to_thread(cluster.wait_dead, victim, limit_s))
        while time.perf_counter() - at["kill"] < limit_s:
            ok_after = [r for r in replies if r.sent > at["kill"] and r.status == 200]
            if ok_after and "first_ok_s" not in at:
                at["first_ok_s"] = min(r.done for r in ok_after) - at["kill"]
            if "full_s" not in at and await asyncio.to_thread(full):
                at["full_s"] = time.perf_counter() - at["kill"]
            if "full_s" in at and time.perf_counter() - at["kill"] > at["full_s"] + after_full_s:
                break
            await asyncio.sleep(1)
        at["dead_s"] = await dead
        stop.set()

    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    at["start"] = time.perf_counter()
    async with httpx.AsyncClient(limits=limits) as client:
        await asyncio.gather(watch(), *(worker(client) for _ in range(concurrency)))
    at["placement_after"] = replicas_by_node(cluster)
    return replies, at


# ---------------------------------------------------------------- Serve autoscaling under a ramp

RAMP = ((1, 30), (4, 40), (12, 60), (4, 30), (1, 70))  # (concurrency, seconds)


def autoscale_yaml(work: Path, port: int) -> Path:
    """configs/serve-cluster.yaml as committed, on ``port``, over configs/cpu.yaml without an
    LLM (/v1/compress needs none; so no LLMServer deployment either)."""
    import yaml

    doc = yaml.safe_load((ROOT / "configs" / "serve-cluster.yaml").read_text())
    doc["http_options"]["port"] = port
    app = doc["applications"][0]
    serve_yaml(work, port)  # writes work/canopy.yaml: cpu.yaml without an LLM
    app["args"]["config"] = str(work / "canopy.yaml")
    app["deployments"] = [d for d in app["deployments"] if d["name"] != "LLMServer"]
    path = work / "serve-cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def replica_counts(cluster: LocalCluster) -> dict[str, int]:
    """RUNNING replicas per deployment (``serve status``)."""
    import yaml

    out = subprocess.run([SERVE, "status", "-a", cluster.dashboard_url], env=cluster.env, capture_output=True,
                         text=True, timeout=60)
    deps = yaml.safe_load(out.stdout)["applications"]["canopy"]["deployments"]
    return {name: d.get("replica_states", {}).get("RUNNING", 0) for name, d in deps.items()}


async def ramp_load(cluster: LocalCluster, url: str, stages=RAMP, hang_s: float = 120,
                    every_s: float = 2.0) -> tuple[list, list, list]:
    """Distinct /v1/compress requests at each stage's concurrency for its seconds; the replies,
    ``(t, concurrency)`` changes and ``(t, replicas per deployment)`` samples (t from the start)."""
    import httpx

    from faults import send

    replies: list = []
    samples: list = []
    changes: list = []
    level = {"n": 0}
    stop = asyncio.Event()
    count = iter(range(10**9))
    t0 = time.perf_counter()

    async def worker(i, client):
        while not stop.is_set():
            if i >= level["n"]:
                await asyncio.sleep(0.1)
                continue
            replies.append(await send(client, url + "/v1/compress", compress_body(next(count)), hang_s))

    async def stepper():
        for n, seconds in stages:
            level["n"] = n
            changes.append((time.perf_counter() - t0, n))
            await asyncio.sleep(seconds)
        stop.set()

    async def sampler():
        while not stop.is_set():
            try:
                counts = await asyncio.to_thread(replica_counts, cluster)
                samples.append((time.perf_counter() - t0, counts))
            except (subprocess.TimeoutExpired, KeyError, TypeError):
                pass
            await asyncio.sleep(every_s)

    top = max(n for n, _ in stages)
    limits = httpx.Limits(max_connections=top + 4, max_keepalive_connections=top + 4)
    async with httpx.AsyncClient(limits=limits) as client:
        await asyncio.gather(stepper(), sampler(), *(worker(i, client) for i in range(top)))
    for r in replies:
        r.sent -= t0
        r.done -= t0
    return replies, changes, samples


def autoscale_part(work: Path, stages=RAMP) -> dict:
    from faults import tally

    work.mkdir(parents=True, exist_ok=True)
    with LocalCluster(workers=2, worker_cpus=2, head_resources={"ingress": 1}) as cluster:
        port, = free_ports(1)  # not an ephemeral port: Serve binds it later
        url = f"http://127.0.0.1:{port}"
        deploy_s = serve_deploy(cluster, autoscale_yaml(work, port), url)
        replies, changes, samples = asyncio.run(ramp_load(cluster, url, stages))
        placement = replicas_by_node(cluster)
    return {**tally(replies), "deploy_s": deploy_s, "stages": [list(s) for s in stages], "changes": changes,
            "samples": samples, "placement_end": placement,
            "timeline": [{"sent": r.sent, "done": r.done, "status": r.status, "reason": r.json_reason}
                         for r in replies]}


def autoscale_windows(r: dict, width: float = 10.0) -> list[dict]:
    """Per ``width`` s window: concurrency, answered req/s, p50/p99 s, Refiner and NodeEncoder replicas (max seen)."""
    import numpy as np

    end = max(t["done"] for t in r["timeline"])
    rows = []
    for a in np.arange(0, end, width):
        ok = [t["done"] - t["sent"] for t in r["timeline"] if t["status"] == 200 and a <= t["done"] < a + width]
        conc = [n for t, n in r["changes"] if t <= a + width / 2][-1] if r["changes"] else 0
        seen = [c for t, c in r["samples"] if a <= t < a + width]
        rows.append({"t": float(a), "concurrency": conc, "rps": len(ok) / width,
                     "p50": float(np.percentile(ok, 50)) if ok else None,
                     "p99": float(np.percentile(ok, 99)) if ok else None,
                     "node_encoder": max(c.get("NodeEncoder", 0) for c in seen) if seen else None,
                     "refiner": max(c.get("Refiner", 0) for c in seen) if seen else None})
    return rows


# ---------------------------------------------------------------- the sweep's actor pool

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


def sweep_part(work: Path, max_actors: int = 4) -> dict:
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


def sweep_table(r: dict) -> list[str]:
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


def plot_sweep(r: dict, path: Path) -> Path:
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


# ---------------------------------------------------------------- Ray Train over nodes

TRAIN_WORKER = "RayTrainWorker"  # the class name of Ray Train's worker actors

TRAIN_DRIVER = """
import dataclasses, json, sys
from canopy_ray.config import load_config
from canopy_ray.trainer import train
a = json.loads(sys.argv[1])
r = train(load_config(a["config"], **a["overrides"]), a["data"], a["storage"], a["name"], a["out"],
          max_steps=a["max_steps"], checkpoint_every=a["every"], limit=a["limit"])
print("RESULT " + json.dumps(dataclasses.asdict(r), default=str))
"""


def start_training(cluster: LocalCluster, log: Path, *, data: dict, storage: Path, name: str, out: Path,
                   overrides: dict, config: str | None = None, max_steps: int | None = None, every: int = 1,
                   limit: int | None = None) -> subprocess.Popen:
    """:func:`canopy_ray.trainer.train` in a driver joined to ``cluster``, writing to ``log``."""
    args = {"config": config, "overrides": overrides, "data": {k: str(v) for k, v in data.items()},
            "storage": str(storage), "name": name, "out": str(out), "max_steps": max_steps, "every": every,
            "limit": limit}
    with log.open("w") as f:
        return subprocess.Popen([sys.executable, "-c", TRAIN_DRIVER, json.dumps(args)], env=cluster.env, cwd=ROOT,
                                stdout=f, stderr=subprocess.STDOUT)


@contextmanager
def driver_reaped_on_failure(proc: subprocess.Popen):
    """A timeout, an error or Ctrl-C in the block kills and reaps the driver: it never outlives us."""
    try:
        yield
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def training_result(proc: subprocess.Popen, log: Path, timeout: float = 600) -> dict:
    """The TrainResult (as a dict) of a driver :func:`start_training` started."""
    with driver_reaped_on_failure(proc):
        rc = proc.wait(timeout)
    text = log.read_text(errors="replace")
    if rc != 0:
        raise RuntimeError(f"training failed ({rc}):\n{text[-3000:]}")
    return json.loads(next(line for line in text.splitlines()[::-1] if line.startswith("RESULT "))[7:])


def train_on_cluster(cluster: LocalCluster, log: Path, timeout: float = 600, **kw) -> dict:
    return training_result(start_training(cluster, log, **kw), log, timeout)


def train_with_node_loss(cluster: LocalCluster, log: Path, *, storage: Path, name: str, after_step: int,
                         timeout: float = 900, **kw) -> dict:
    """A training run whose worker node holding a Ray Train worker is SIGKILLed once a checkpoint
    of step >= ``after_step`` is registered; Ray Train (``training.max_failures``) restarts the
    workers on the nodes left, from the newest checkpoint registered. Its TrainResult with the
    step registered just before the kill and the node lost."""
    from canopy_ray.trainer import registered_step

    proc = start_training(cluster, log, storage=storage, name=name, **kw)
    run_dir = storage / name
    deadline = time.monotonic() + timeout
    with driver_reaped_on_failure(proc):
        while (registered_step(run_dir) or 0) < after_step:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no checkpoint of step >= {after_step} registered:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        victim = sorted(cluster.running(f"ray::{TRAIN_WORKER}"))[0]
        before = registered_step(run_dir)
        t0 = time.monotonic()
        cluster.kill(victim)
    res = training_result(proc, log, max(deadline - time.monotonic(), 1))
    return res | {"lost": victim, "registered_at_kill": before, "after_kill_s": time.monotonic() - t0,
                  "left": cluster.left(victim)}


def train_part(work: Path, steps: int = 20) -> dict:
    """The three ``train`` runs (module docstring), ``steps`` steps each, a checkpoint every 2."""
    import re

    sample = ROOT / "canopy_ray" / "assets" / "sample"
    work.mkdir(parents=True, exist_ok=True)
    runs = {}
    with LocalCluster(workers=3, worker_cpus=1) as cluster:
        for name, n in (("1", 1), ("2", 2), ("2, node lost", 2)):
            log, key = work / f"w{len(runs)}.log", f"w{len(runs)}"
            o = {"training": {"workers": n, "epochs": 3, "lora_dropout": 0.0, "val_instances": 64, "val_items": 0,
                              "max_failures": 1}}
            kw = dict(data={"hotpotqa": sample}, storage=work / "runs", name=key, out=work / f"adapter-{key}",
                      overrides=o, config=str(ROOT / "configs" / "cpu.yaml"), max_steps=steps, every=2)
            t = time.monotonic()
            res = (train_with_node_loss(cluster, log, after_step=2, timeout=1500, **kw) if "lost" in name
                   else train_on_cluster(cluster, log, timeout=1500, **kw))
            curve = {int(a): float(b) for a, b in re.findall(r"step (\d+): validation decision accuracy ([\d.]+)",
                                                             log.read_text(errors="replace"))}
            runs[name] = res | {"curve": sorted(curve.items()), "driver_s": time.monotonic() - t}
        placement = cluster.actors_by_node(TRAIN_WORKER, state=None)
    return {"runs": runs, "placement": placement, "steps": steps}


def train_table(r: dict) -> list[str]:
    lines = ["### Ray Train: f_theta with 1 and 2 data-parallel workers, and a node lost", "",
             "| workers | steps | resumed from step | instances | wall s (the call) | s in training steps (rank 0, "
             "since the last start) | validation decision accuracy, last |", "|---|---|---|---|---|---|---|"]
    for n, run in r["runs"].items():
        last = run["curve"][-1][1] if run["curve"] else None
        lines.append(f"| {n} | {run['steps']} | {run['start_step']} | {run['instances']} | {run['wall_s']:.1f} "
                     f"| {run['train_s']:.1f} | {_s(last, '{:.4f}')} |")
    lost = r["runs"].get("2, node lost")
    if lost:
        cost = lost["wall_s"] - r["runs"]["2"]["wall_s"]
        lines += ["", f"The node lost ({lost['lost']}) held a Train worker; it was SIGKILLed when Ray Train had "
                      f"registered the checkpoint of step {lost['registered_at_kill']}, and the run finished "
                      f"{lost['after_kill_s']:.1f} s later, {cost:+.1f} s against the uninterrupted 2-worker run."]
    return lines + ["", f"Ray Train worker actors per node over the three runs: {r['placement']}. Each global batch "
                        "is dealt over the workers and DDP averages their gradients, so the curves should agree to "
                        "noise.", ""]


def plot_train(r: dict, path: Path) -> Path:
    from canopy_ray.plots import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for (n, run), ls in zip(r["runs"].items(), ("-", "--", ":")):
        workers, _, lost = n.partition(", ")
        ax.plot([s for s, _ in run["curve"]], [a for _, a in run["curve"]], ls, marker="o", ms=3,
                label=f"{workers} worker{'s' if workers != '1' else ''}" + (f", {lost}" if lost else ""))
        if "registered_at_kill" in run:
            ax.axvline(run["registered_at_kill"], color="grey", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("validation decision accuracy")
    ax.legend(fontsize=8)
    ax.set_title("f_theta training: 1 worker, 2 workers, 2 workers with a node lost", fontsize=10)
    return save(fig, path, 120)


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


def serve_part(work: Path, health_check_s=None, concurrency: int = 4, before_s: float = 20) -> dict:
    from faults import faults_seen, tally

    work.mkdir(parents=True, exist_ok=True)
    with LocalCluster(workers=2, worker_cpus=2, head_resources={"ingress": 1},
                      health_check_s=health_check_s) as cluster:
        port, = free_ports(1)  # not an ephemeral port: Serve binds it later
        url = f"http://127.0.0.1:{port}"
        deploy_s = serve_deploy(cluster, serve_yaml(work, port), url)
        placement = replicas_by_node(cluster)
        replies, at = asyncio.run(serve_with_node_loss(cluster, url, concurrency, before_s,
                                                       victim=busiest_worker(placement)))
        faults = faults_seen(url)  # the Ingress's count of retried calls and the faults it answered
    t0, kill = at["start"], at["kill"]
    timeline = [{"sent": r.sent - kill, "done": r.done - kill, "status": r.status, "reason": r.json_reason}
                for r in replies]
    return {**tally(replies), "deploy_s": deploy_s, "placement": placement, "placement_after": at["placement_after"],
            "victim": at["victim"], "killed": at["killed"], "dead_s": at["dead_s"], "first_ok_s": at.get("first_ok_s"),
            "full_s": at.get("full_s"), "before": at["before"], "faults": faults,
            "load_s": max(r.done for r in replies) - t0,
            "concurrency": concurrency, "timeline": timeline}


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


# ---------------------------------------------------------------- the report

def _s(v, fmt="{:.1f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def index_table(r: dict) -> list[str]:
    same = r["same_index"]
    how = "resubmitted (the same command again)" if r["resubmitted"] else "by itself"
    cost = r["total_s"] - r["ref_s"]
    return [
        f"### Index job, worker-1 lost ({r['items']} text items, 2 embedding actors, one per worker node)", "",
        "| run | wall s | input shards on disk at the kill | node marked dead after (s) | finished "
        "| index vs uninterrupted | cost of the loss |", "|---|---|---|---|---|---|---|",
        f"| uninterrupted | {r['ref_s']:.1f} | | | by itself | | |",
        f"| worker-1 SIGKILLed at {r['kill_s']:.1f} s ({len(r['killed'])} processes) | {r['total_s']:.1f} "
        f"| {r['parts_at_kill']} of {r['shards']} | {r['marked_dead_s']:.1f} | {how} "
        f"| ids equal {same['ids_equal']}, each once {same['ids_unique']}; max vector difference "
        f"{max(same['max_item_diff'], same['max_node_diff']):.2g}; manifest checksums equal {same['checksums_equal']} "
        f"| +{cost:.1f} s ({100 * cost / r['ref_s']:+.0f}%) |", "",
        f"Embedding actors per node over both runs (`ray list actors`; a restarted actor keeps its id and shows "
        f"where it ran last): {r['placement_after']}. Lines embedded by the interrupted run: "
        f"{(r['summary'] or {}).get('rows_computed')} of {(r['summary'] or {}).get('input_lines')} (none twice).", ""]


def _pcts(xs: list[float]) -> str:
    import numpy as np

    return f"{np.percentile(xs, 50):.2f} / {np.percentile(xs, 99):.2f}" if xs else "n/a"


def serve_table(r: dict) -> list[str]:
    tl = r["timeline"]
    ok_before = [t["done"] - t["sent"] for t in tl if t["status"] == 200 and t["done"] < 0]
    ok_after = [t["done"] - t["sent"] for t in tl if t["status"] == 200 and t["sent"] >= 0]
    failed = ", ".join(f"{k}: {v}" for k, v in r["failed"].items()) or "0"
    return [
        f"### Serve, {r.get('victim', 'worker-1')} lost under load (/v1/compress at concurrency {r['concurrency']})",
        "",
        "| requests | 200 | failed (by status) | hung | failures not JSON with a reason | first success after the "
        "kill (s) | node marked dead (s) | every model deployment back to 2 replicas (s) | p50 / p99 s before "
        "| p50 / p99 s after |", "|---|---|---|---|---|---|---|---|---|---|",
        f"| {r['sent']} | {r['ok']} | {failed} | {r['hung']} | {r['not_json']} | {_s(r['first_ok_s'])} "
        f"| {_s(r['dead_s'])} | {_s(r['full_s'])} | {_pcts(ok_before)} | {_pcts(ok_after)} |", "",
        f"Replicas per node before: {r['placement']}; after: {r['placement_after']}. The Ingress runs beside the "
        "proxy on the head and repeats a call whose replica died (`serve.retries`) on a live one: "
        f"{_retried(r)}. Reasons of failures: {r['reasons'] or 'none'}. Deploying took {r['deploy_s']:.0f} s.", ""]


def _retried(r: dict) -> str:
    if "faults" not in r:
        return "how many it repeated was not recorded in this run"
    retried = {k[len("retried_"):]: v for k, v in r["faults"].items() if k.startswith("retried_")}
    return "it repeated " + (", ".join(f"{v} {k} calls" for k, v in retried.items()) or "no call")


def plot_index(r: dict, path: Path) -> Path:
    from canopy_ray.plots import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 2.6))
    ax.barh([1, 0], [r["ref_s"], r["total_s"]], color=["#4c72b0", "#dd8452"])
    ax.set_yticks([1, 0], ["uninterrupted", "worker-1 lost"])
    ax.axvline(r["kill_s"], color="k", ls="--", lw=1, label="worker-1 SIGKILLed")
    ax.axvline(r["kill_s"] + r["marked_dead_s"], color="r", ls=":", lw=1, label="marked dead by the GCS")
    ax.set_xlabel("seconds (index job wall time)")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(f"Index job over 2 worker nodes, {r['items']} items", fontsize=10)
    return save(fig, path, 120)


def plot_serve(r: dict, path: Path) -> Path:
    import numpy as np

    from canopy_ray.plots import pyplot, save

    plt = pyplot()
    tl = r["timeline"]
    lo, hi = int(np.floor(min(t["done"] for t in tl))), int(np.ceil(max(t["done"] for t in tl)))
    secs = np.arange(lo, hi + 1)
    ok = [sum(1 for t in tl if t["status"] == 200 and s <= t["done"] < s + 1) for s in secs]
    bad = [sum(1 for t in tl if t["status"] != 200 and s <= t["done"] < s + 1) for s in secs]
    p99 = [np.percentile(x, 99) if (x := [t["done"] - t["sent"] for t in tl if t["status"] == 200
                                          and s <= t["done"] < s + 1]) else np.nan for s in secs]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    a1.bar(secs, ok, width=1, color="#55a868", label="answered 200")
    a1.bar(secs, bad, width=1, bottom=ok, color="#c44e52", label="failed (JSON 5xx)")
    a1.set_ylabel("requests / s")
    a2.plot(secs, p99, color="#4c72b0", label="p99 latency of that second")
    a2.set_ylabel("seconds")
    a2.set_xlabel(f"seconds since {r.get('victim', 'worker-1')} was SIGKILLed")
    for ax in (a1, a2):
        ax.axvline(0, color="k", ls="--", lw=1, label="kill")
        if r["dead_s"] is not None:
            ax.axvline(r["dead_s"], color="r", ls=":", lw=1, label="marked dead")
        if r["full_s"] is not None:
            ax.axvline(r["full_s"], color="g", ls="-.", lw=1, label="all replicas back")
    a1.legend(fontsize=7, loc="upper left")
    a2.legend(fontsize=7, loc="upper left")
    a1.set_title("Serve /v1/compress across 2 worker nodes, one lost", fontsize=10)
    return save(fig, path, 120)


def autoscale_table(r: dict) -> list[str]:
    stages = ", ".join(f"{n} for {s} s" for n, s in r["stages"])
    lines = [f"### Serve autoscaling under a load ramp (configs/serve-cluster.yaml; concurrency {stages})", "",
             f"{r['sent']} requests, {r['ok']} answered 200, failed {r['failed'] or 0}, hung {r['hung']}, "
             f"not JSON {r['not_json']}. Replicas at the end: {r['placement_end']}.", "",
             "| t (s) | concurrency | answered req/s | p50 s | p99 s | Refiner / NodeEncoder replicas |",
             "|---|---|---|---|---|---|"]
    for w in autoscale_windows(r):
        reps = f"{w['refiner']} / {w['node_encoder']}" if w["refiner"] is not None else "n/a"
        lines.append(f"| {w['t']:.0f} | {w['concurrency']} | {w['rps']:.2f} | {_s(w['p50'], '{:.2f}')} "
                     f"| {_s(w['p99'], '{:.2f}')} | {reps} |")
    return lines + ["", "Replicas are sampled by `serve status` (n/a: no sample finished in that window, the "
                        "command itself being slow on the busy machine)." + (f" {r['note']}" if r.get("note") else ""),
                    ""]


def plot_autoscale(r: dict, path: Path) -> Path:
    from canopy_ray.plots import pyplot, save

    plt = pyplot()
    rows = autoscale_windows(r, 5.0)
    t = [w["t"] for w in rows]
    fig, (a1, a2, a3) = plt.subplots(3, 1, figsize=(8, 6.5), sharex=True)
    names = sorted({k for _, c in r["samples"] for k in c})
    for name in names:
        a1.step([s for s, _ in r["samples"]], [c.get(name, 0) for _, c in r["samples"]], where="post", label=name)
    a1.step([c for c, _ in r["changes"]], [n for _, n in r["changes"]], where="post", color="k", ls="--",
            label="client concurrency")
    a1.set_ylabel("replicas")
    a1.legend(fontsize=7, ncol=3)
    a2.plot(t, [w["rps"] for w in rows], color="#55a868")
    a2.set_ylabel("answered req/s")
    a3.plot(t, [w["p50"] for w in rows], label="p50")
    a3.plot(t, [w["p99"] for w in rows], label="p99")
    a3.set_ylabel("latency s")
    a3.set_xlabel("seconds since the ramp began")
    a3.legend(fontsize=7)
    a1.set_title("Serve autoscaling over 2 worker nodes, /v1/compress load ramp", fontsize=10)
    return save(fig, path, 120)


def report(results: dict, preface: str, out: Path) -> str:
    lines = ["# canopy-ray on several Ray nodes", "", preface, ""]
    parts = (("index", index_table, plot_index, "index job node loss"),
             ("serve", serve_table, plot_serve, "serve node loss timeline"),
             ("train", train_table, plot_train, "1 vs 2 Train workers, a node lost"),
             ("autoscale", autoscale_table, plot_autoscale, "autoscaling ramp"),
             ("sweep", sweep_table, plot_sweep, "the sweep's actor pool over time"))
    for part, table, plot, alt in parts:
        if part in results:
            png = plot(results[part], out.with_name(f"cluster_{part}.png"))
            lines += table(results[part]) + [f"![{alt}]({png.name})", ""]
    return "\n".join(lines)


def _by_stamp(results: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for part, r in results.items():
        out.setdefault(r["measured_by"], []).append(part)
    return out


def main(argv=None) -> int:
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="index,serve,autoscale,train,sweep",
                   help="index, serve, autoscale, train, sweep (comma list)")
    p.add_argument("--items", type=int, default=600, help="text items of the index part")
    p.add_argument("--out", default=None, help="write the report here (markdown; its PNGs and a JSON of the raw "
                                               "results beside it; parts not run now are kept from that JSON)")
    args = p.parse_args(argv)
    out = Path(args.out) if args.out else None
    raw = out.with_suffix(".json") if out else None
    results = json.loads(raw.read_text()) if raw and raw.exists() else {}
    command = " ".join(["python benchmarks/cluster.py", *(sys.argv[1:] if argv is None else argv)])
    stamp = (f"`{command}` on {os.cpu_count()} CPU cores (load average {os.getloadavg()[0]:.1f} at the start: other "
             f"jobs share them), {time.strftime('%Y-%m-%d')}")
    with tempfile.TemporaryDirectory(prefix="canopy-cluster-") as tmp:
        for part in filter(None, args.parts.split(",")):  # --parts "": the report again from the JSON
            if part == "index":
                results["index"] = index_part(Path(tmp) / "index", args.items) | {"measured_by": stamp}
            elif part == "serve":
                results["serve"] = serve_part(Path(tmp) / "serve") | {"measured_by": stamp}
            elif part == "train":
                results["train"] = train_part(Path(tmp) / "train") | {"measured_by": stamp}
            elif part == "autoscale":
                results["autoscale"] = autoscale_part(Path(tmp) / "autoscale") | {"measured_by": stamp}
            elif part == "sweep":
                results["sweep"] = sweep_part(Path(tmp) / "sweep") | {"measured_by": stamp}
            print(part, json.dumps({k: v for k, v in results[part].items() if k != "timeline"}, default=str),
                  flush=True)
            if raw:  # kept at once: the report can be drawn again from it
                raw.parent.mkdir(parents=True, exist_ok=True)
                raw.write_text(json.dumps(results, indent=1, default=str) + "\n")
    preface = ("A head without CPUs and two worker nodes of 2 CPUs (train: three of 1 CPU) on 127.0.0.1 "
               "(`benchmarks/local_cluster.py`), "
               "token auth on, Ray's default health checks (a node is marked dead after 5 missed checks 3 s apart); "
               "a node is lost by SIGKILL of every process of it at once. Measured by "
               + "; ".join(f"{stamp} ({', '.join(parts)})" for stamp, parts in _by_stamp(results).items()) + ".")
    markdown = report(results, preface, out or Path("cluster.md"))
    print(markdown)
    if out:
        out.write_text(markdown + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
