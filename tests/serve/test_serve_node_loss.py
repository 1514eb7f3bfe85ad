"""Serve across nodes, a worker node lost under load: the application (configs/cpu.yaml's,
no LLM: /v1/compress) deployed with ``serve deploy`` on a head and two worker nodes on 127.0.0.1
(``tests/support/local_cluster.py``), two replicas of each model deployment on the workers (Ray
spreads them softly), the Ingress beside the HTTP proxy on the head. Under load at concurrency 4,
the worker holding the most replicas is SIGKILLed, every process of it at once (raylet, agents,
its replicas).

Every request gets an answer: a 200 or a JSON 5xx with a reason (never plain text, never a
reset, never a hang), requests succeed again soon after the kill, and Serve brings every model
deployment back to two replicas on the surviving worker. The bounds are hang bounds only; the
times are measured by ``benchmarks/cluster_serve.py``.
"""

import asyncio
import shutil

import pytest

from tests.support.local_cluster import RAY, LocalCluster, free_ports
from tests.support.node_loss import (SERVE, SPREAD, busiest_worker, replicas_by_node, serve_deploy,
                                     serve_with_node_loss, serve_yaml)

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which(RAY) is None or shutil.which(SERVE) is None,
                                 reason=f"no `ray` / `serve` commands next to the interpreter ({RAY})")]


def test_a_worker_node_lost_under_load(tmp_path):
    with LocalCluster(workers=2, worker_cpus=2, head_resources={"ingress": 1}, health_check_s=(1.0, 5)) as cluster:
        port, = free_ports(1)
        url = f"http://127.0.0.1:{port}"
        serve_deploy(cluster, serve_yaml(tmp_path, port, replicas=2), url, timeout=300)
        before = replicas_by_node(cluster)
        for d in SPREAD:  # two replicas of each model deployment, on the workers
            assert sum(before[d].values()) == 2 and "head" not in before[d], (before, dead_replicas(cluster))
        assert before["Ingress"] == {"head": 1}
        victim = busiest_worker(before)
        survivor = ({"worker-1", "worker-2"} - {victim}).pop()

        replies, at = asyncio.run(serve_with_node_loss(cluster, url, concurrency=4, before_s=5, after_full_s=1,
                                                       victim=victim, hang_s=120, limit_s=200, replicas=2))
        assert any("raylet" in k for k in at["killed"]) and any("ServeReplica" in k for k in at["killed"])
        assert cluster.left(victim) == []
        assert cluster.alive() == {"head", survivor}

    assert at["before"] >= 1 and len(replies) > at["before"]
    bad = [(r.status, r.json_reason) for r in replies
           if r.status != 200 and not (isinstance(r.status, int) and 500 <= r.status < 600 and r.json_reason)]
    assert bad == [], bad  # only 200 or a JSON 5xx with a reason: no text page, reset or hang
    assert at.get("first_ok_s") is not None  # a request sent after the kill succeeded
    assert at.get("full_s") is not None, at["placement_after"]  # every model deployment back to 2 replicas
    after = at["placement_after"]
    for d in SPREAD:
        assert after[d] == {survivor: 2}, after


def dead_replicas(cluster) -> list:
    """Replicas that died before any node was lost (why, if Ray says), for a failure message."""
    return [(a["class_name"], a["node"], a.get("death_cause")) for a in cluster.list_actors(state="DEAD")
            if a["class_name"].startswith("ServeReplica:")]
