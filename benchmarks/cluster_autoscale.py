"""Serve autoscaling on several Ray nodes under a load ramp (docs/multi-node.md).

    python benchmarks/cluster_autoscale.py [--out results/bench/cluster.md]

``configs/serve-cluster.yaml`` as committed (autoscaling 2..N replicas) on a head without CPUs and
two worker nodes of 2 CPUs, under a load ramp (:data:`RAMP`); replicas per deployment (``serve
status`` every 2 s), answered req/s and p50/p99 over time. On 2 shared cores more replicas cannot
add throughput: the figure shows the autoscaler's decisions and what latency does meanwhile. The
report and its other parts: ``benchmarks/cluster_report.py``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

# a script's own folder (benchmarks/) is on the path, the repository root with tests.support is not
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cluster_report import ROOT, _s, main  # noqa: E402

from tests.support.local_cluster import LocalCluster, free_ports  # noqa: E402
from tests.support.node_loss import SERVE, compress_body, replicas_by_node, serve_deploy, serve_yaml  # noqa: E402

ALT = "autoscaling ramp"
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

    from tests.support.replies import send

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


def measure(work: Path, stages=RAMP) -> dict:
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


def table(r: dict) -> list[str]:
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


def plot(r: dict, path: Path) -> Path:
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


if __name__ == "__main__":
    raise SystemExit(main("autoscale", measure, __doc__))
