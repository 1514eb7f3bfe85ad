"""Runs on a :class:`~tests.support.local_cluster.LocalCluster` that lose a worker node, with
what happened and when: the tests assert on them, ``benchmarks/cluster_*.py`` time and tabulate them.

- The index job (``jobs/index.py``) over synthetic text items, a node SIGKILLed once a share of the
  input shards are on disk (:func:`index_with_node_loss`), and what its index shares with an
  uninterrupted run's (:func:`same_index`).
- The application (configs/cpu.yaml's, no LLM) by ``serve deploy`` across the nodes
  (:func:`serve_yaml`, :func:`serve_deploy`), and /v1/compress load while the worker holding the
  most replicas is lost (:func:`serve_with_node_loss`).
- :func:`canopy_ray.trainer.train` in a driver joined to the cluster (:func:`train_on_cluster`),
  and a run whose node holding a Ray Train worker is lost after a checkpoint
  (:func:`train_with_node_loss`).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from tests.support.local_cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- the index job

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

    from tests.support.replies import send

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
