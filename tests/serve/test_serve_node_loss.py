"""Serve across nodes, a worker node lost under load: the application (configs/cpu.yaml's,
no LLM: /v1/compress) deployed with ``serve deploy`` on a head and two worker nodes on 127.0.0.1
(``benchmarks/local_cluster.py``), two replicas of each model deployment spread over the workers,
the Ingress beside the HTTP proxy on the head. Under load at concurrency 4, worker-1 is
SIGKILLed, every process of it at once (raylet, agents, its replicas).

Every request gets an answer: a 200 or a JSON 5xx with a reason (never plain text, never a
reset, never a hang), requests succeed again soon after the kill, and Serve brings every model
deployment back to two replicas on the surviving node. The bounds are hang bounds only; the
times are measured by ``benchmarks/cluster.py``.
"""

import asyncio
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from cluster import (SERVE, SPREAD, replicas_by_node, serve_deploy, serve_with_node_loss,  # noqa: E402
                     serve_yaml)
from floor import free_port  # noqa: E402
from local_cluster import RAY, LocalCluster  # noqa: E402

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which(RAY) is None or shutil.which(SERVE) is None,
                                 reason=f"no `ray` / `serve` commands next to the interpreter ({RAY})")]


def test_a_worker_node_lost_under_load(tmp_path):
    with LocalCluster(workers=2, worker_cpus=2, head_resources={"ingress": 1}, health_check_s=(1.0, 5)) as cluster:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        serve_deploy(cluster, serve_yaml(tmp_path, port, replicas=2), url, timeout=300)
        before = replicas_by_node(cluster)
        for d in SPREAD:  # spread: one replica of each model deployment on each worker
            assert before[d] == {"worker-1": 1, "worker-2": 1}, before
        assert before["Ingress"] == {"head": 1}

        replies, at = asyncio.run(serve_with_node_loss(cluster, url, concurrency=4, before_s=8, after_full_s=3,
                                                       victim="worker-1", hang_s=120, limit_s=200, replicas=2))
        assert any("raylet" in k for k in at["killed"]) and any("ServeReplica" in k for k in at["killed"])
        assert cluster.left("worker-1") == []
        assert cluster.alive() == {"head", "worker-2"}

    assert at["before"] >= 1 and len(replies) > at["before"]
    bad = [(r.status, r.json_reason) for r in replies
           if r.status != 200 and not (isinstance(r.status, int) and 500 <= r.status < 600 and r.json_reason)]
    assert bad == [], bad  # only 200 or a JSON 5xx with a reason: no text page, reset or hang
    assert at.get("first_ok_s") is not None  # a request sent after the kill succeeded
    assert at.get("full_s") is not None, at["placement_after"]  # every model deployment back to 2 replicas
    after = at["placement_after"]
    for d in SPREAD:
        assert after[d] == {"worker-2": 2}, after
