"""docs/multi-node.md's commands, run as written against a head and two worker nodes on
127.0.0.1 (Ray token authentication on): the head, its token handed to the workers, ``ray job
submit`` of the index job with two embedding actors, ``ray list actors`` to see where they ran
(one per worker, none on the head), ``ray stop``.

As in ``test_cluster_commands.py``, the sequence runs in a PID namespace of its own
(``unshare``), because ``ray stop`` stops every Ray process it can see; only what keeps the nodes
apart on one machine is added to the commands (a private temp dir and free ports per node, each
given after the documented flags, which it overrides).
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.jobs.processes import run_in_own_pids, shell_text, unshare_ok

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from local_cluster import free_ports, isolate_flags, node_ports  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "index" / "corpus.jsonl"
DOC = ROOT / "docs" / "multi-node.md"

HEAD = [
    "ray get-auth-token --generate > /dev/null",
    "export RAY_AUTH_MODE=token",
    "ray start --head --port 6379 --num-cpus 0 --labels canopy-node=head",
    "TOKEN=$(ray get-auth-token)",
]
WORKER = [
    'export RAY_AUTH_MODE=token RAY_AUTH_TOKEN="$TOKEN"',
    'ray start --address "$HEAD_IP:6379" --num-cpus 2 --labels canopy-node=worker-1',
]
JOBS = [
    'ray job submit --working-dir . -- python jobs/index.py --config configs/cpu.yaml --corpus "$CORPUS" '
    '--out "$OUT/index" --actors 2',
    'ray list actors --detail --filter "class_name=MapWorker(MapBatches(SliceEmbedder))"',
    "ray stop",
]


pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not unshare_ok(),
                       reason="needs a PID namespace (unshare): `ray stop` would stop every Ray on the machine"),
]


def test_doc_shows_these_commands():
    doc = shell_text(DOC)
    for cmd in HEAD + WORKER + JOBS:
        assert cmd in doc, cmd


def test_multi_node_commands_as_documented():
    work = Path(tempfile.mkdtemp(prefix="canopy-mn-", dir="/tmp"))  # short: Ray's socket paths
    try:
        gcs, dash, client = free_ports(3)
        head_iso = " ".join(isolate_flags(node_ports(), work / "head") + [
            f"--port={gcs}", f"--dashboard-port={dash}", f"--ray-client-server-port={client}"])
        script = [
            # the head
            HEAD[0], HEAD[1], f"{HEAD[2]} {head_iso}", HEAD[3],
            'test -n "$TOKEN"',
            "HEAD_IP=127.0.0.1",
        ]
        for i in (1, 2):  # two workers: the documented lines, each node on its own ports
            iso = " ".join(isolate_flags(node_ports(), work / f"worker-{i}") + [f"--address=127.0.0.1:{gcs}"])
            script += [WORKER[0], f"{WORKER[1].replace('worker-1', f'worker-{i}')} {iso}"]
        script += [
            # the clients find this head on its private ports
            f"export RAY_ADDRESS=127.0.0.1:{gcs} RAY_API_SERVER_ADDRESS=http://127.0.0.1:{dash}",
            JOBS[0],
            f'{JOBS[1]} > "$OUT/actors.yaml"',
            'ray list nodes --detail > "$OUT/nodes.yaml"',
            JOBS[2],
        ]
        out = run_in_own_pids(script, work, 300, CORPUS=str(CORPUS))
        assert "Job 'raysubmit_" in out and "succeeded" in out, out[-3000:]
        manifest = json.loads((work / "index" / "manifest.json").read_text())
        assert manifest["count"] == 13

        nodes = yaml.safe_load((work / "nodes.yaml").read_text())
        names = {n["node_id"]: n["labels"].get("canopy-node") for n in nodes}
        assert sorted(names.values()) == ["head", "worker-1", "worker-2"]
        actors = yaml.safe_load((work / "actors.yaml").read_text())
        assert len(actors) == 2
        # Ray Data spread the two embedding actors: one on each worker, none on the head
        assert sorted(names[a["node_id"]] for a in actors) == ["worker-1", "worker-2"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
