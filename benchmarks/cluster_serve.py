"""Serve on several Ray nodes, a worker node lost under load (docs/multi-node.md).

    python benchmarks/cluster_serve.py [--out results/bench/cluster.md]

The application (configs/cpu.yaml's, no LLM) by ``serve deploy`` on a head without CPUs and two
worker nodes of 2 CPUs, two replicas of each model deployment on the workers and the Ingress
beside the proxy on the head (:func:`tests.support.node_loss.serve_yaml`); distinct /v1/compress
requests at concurrency 4, the worker holding the most replicas SIGKILLed after 20 s. Per second:
answered and failed requests, p99; when the GCS marked the node dead, when a request succeeded
again, when every model deployment was back to two replicas. The report and its other parts:
``benchmarks/cluster_report.py``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

# a script's own folder (benchmarks/) is on the path, the repository root with tests.support is not
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cluster_report import _s, main  # noqa: E402

from tests.support.local_cluster import LocalCluster, free_ports  # noqa: E402
from tests.support.node_loss import (busiest_worker, replicas_by_node, serve_deploy, serve_with_node_loss,  # noqa: E402
                                     serve_yaml)

ALT = "serve node loss timeline"


def measure(work: Path, health_check_s=None, concurrency: int = 4, before_s: float = 20) -> dict:
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


def _pcts(xs: list[float]) -> str:
    import numpy as np

    return f"{np.percentile(xs, 50):.2f} / {np.percentile(xs, 99):.2f}" if xs else "n/a"


def table(r: dict) -> list[str]:
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


def plot(r: dict, path: Path) -> Path:
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


if __name__ == "__main__":
    raise SystemExit(main("serve", measure, __doc__))
