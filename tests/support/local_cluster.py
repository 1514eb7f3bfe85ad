"""Several Ray nodes on 127.0.0.1, started with the commands of docs/multi-node.md, that a test
or a benchmark can lose one at a time with SIGKILL.

    with LocalCluster(workers=2) as cluster:
        env = cluster.env          # RAY_ADDRESS, the token: a driver or `ray job submit` joins with it
        cluster.kill("worker-1")   # the node's raylet, agents and every worker process on it

Each node is one ``ray start`` (a head, then ``--address`` per worker) with token
authentication on (a private token in ``RAY_AUTH_TOKEN``, never the user's ``~/.ray``), a
private ``--temp-dir``, free ports on 127.0.0.1 and a ``canopy-node`` label, so placement is
visible in ``ray list actors`` / ``ray.nodes()``. The head has no CPUs (it runs the drivers, the
GCS, the Serve controller and proxy), so work lands on the workers. Every ``ray start`` runs in a
session of its own: its daemons and the worker processes its raylet forks keep that session id,
so the session id finds every process of one node and nothing else; losing a node and closing
the cluster are SIGKILLs by those PIDs, never ``ray stop`` (which stops every Ray on the machine).

The GCS declares a silent node dead after ``health_check_failure_threshold`` missed checks of
``health_check_period_ms``; Ray's defaults (3 s x 5) are kept unless ``health_check_s`` says
otherwise (a test sets 1 s x 5 to stay short).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).parent / "ray")


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_HANDED: set[int] = set()  # every port free_ports has returned in this process
_HANDED_LOCK = threading.Lock()


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports of 127.0.0.1 (all held open together, so none repeats), drawn
    between Ray's worker ports (10002-19999) and the kernel's ephemeral range: a port bound
    minutes later (a node's, Serve's HTTP port) is not taken meanwhile as the source port of some
    process's outgoing connection, as an ephemeral one can be. A port is returned once per
    process, so nodes started at once never draw the same one."""
    socks, ports = [], []
    candidates = list(range(20000, _ephemeral_start()))
    random.shuffle(candidates)
    with _HANDED_LOCK:
        try:
            for port in candidates:
                if len(ports) == n:
                    break
                if port in _HANDED:
                    continue
                s = socket.socket()
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    s.close()
                    continue
                socks.append(s)
                ports.append(port)
            while len(ports) < n:  # no room below the ephemeral range: let the kernel choose
                s = socket.socket()
                s.bind(("127.0.0.1", 0))
                socks.append(s)
                ports.append(s.getsockname()[1])
            _HANDED.update(ports)
            return ports
        finally:
            for s in socks:
                s.close()


def node_ports() -> dict[str, int]:
    """The ports one node listens on, besides the head's own (``ray start`` flags)."""
    names = ["node-manager-port", "object-manager-port", "metrics-export-port", "dashboard-agent-listen-port",
             "dashboard-agent-grpc-port", "runtime-env-agent-port"]
    return dict(zip(names, free_ports(len(names))))


def isolate_flags(ports: dict[str, int], temp_dir: Path) -> list[str]:
    """What keeps a node apart from any other Ray on this machine."""
    flags = [f"--{k}={v}" for k, v in ports.items()]
    return flags + [f"--temp-dir={temp_dir}", "--node-ip-address=127.0.0.1", "--min-worker-port=0",
                    "--max-worker-port=0", "--disable-usage-stats"]


@dataclass
class Node:
    name: str
    sid: int  # the session id of its ``ray start``: every process of the node carries it
    ports: dict[str, int]
    cpus: int
    killed_at: float | None = None
    killed: list[str] = field(default_factory=list)  # "PID title" of each process the kill reached

    @property
    def metrics_port(self) -> int:
        return self.ports["metrics-export-port"]


def session_processes(sid: int) -> list[psutil.Process]:
    """Live processes of session ``sid`` (zombies waiting to be reaped do not count)."""
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getsid(p.pid) == sid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (OSError, psutil.Error):
            continue
    return out


class LocalCluster:
    """A head and ``workers`` worker nodes (``worker_cpus`` CPUs each, label ``canopy-node=worker-N``)."""

    def __init__(self, workers: int = 2, worker_cpus: int = 2, head_cpus: int = 0, dashboard: bool = True,
                 health_check_s: tuple[float, int] | None = None, object_store_mb: int = 256,
                 worker_resources: dict[str, float] | None = None, head_resources: dict[str, float] | None = None,
                 node_env: dict[str, str] | None = None):
        self.root = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))  # short: Ray's socket paths
        self.n_workers, self.worker_cpus, self.head_cpus = workers, worker_cpus, head_cpus
        self.dashboard, self.health_check_s, self.object_store_mb = dashboard, health_check_s, object_store_mb
        self.worker_resources, self.head_resources = worker_resources or {}, head_resources or {}
        self.node_env = node_env or {}  # Ray settings for every process of the nodes
        self._names: dict[str, str] = {}  # node_id -> our name: a node's id never changes
        self.token = secrets.token_hex(32)  # as `ray get-auth-token --generate` makes one
        self.gcs_port, self.dashboard_port, self.client_port = free_ports(3)
        self.nodes: dict[str, Node] = {}

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def env(self) -> dict[str, str]:
        """The environment of a process that joins this cluster (a driver, ``ray job submit``,
        ``ray list``): its address and token; no other ``RAY_`` variable of ours leaks in."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        return env | {"RAY_ADDRESS": self.address, "RAY_API_SERVER_ADDRESS": self.dashboard_url,
                      "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
                      "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
                      "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}

    def _node_env(self) -> dict[str, str]:
        env = self.env | self.node_env
        del env["RAY_ADDRESS"], env["RAY_API_SERVER_ADDRESS"]
        if self.health_check_s:  # read by the GCS (head) from its environment
            period, threshold = self.health_check_s
            env |= {"RAY_health_check_period_ms": str(int(period * 1000)),
                    "RAY_health_check_failure_threshold": str(threshold)}
        return env

    def _start(self, name: str, flags: list[str], cpus: int, attempts: int = 3) -> Node:
        """``ray start`` of one node. ``ray start`` gives a raylet 30 s (fixed) to register with
        the GCS; on a machine busy with other work that can pass, so a failed start's processes
        are killed and the node started again, on fresh ports."""
        for attempt in range(1, attempts + 1):
            ports = node_ports()
            argv = [RAY, "start", *flags, f"--num-cpus={cpus}", f"--labels=canopy-node={name}",
                    f"--object-store-memory={self.object_store_mb * 2**20}",
                    *isolate_flags(ports, self.root / f"{name}-{attempt}")]
            log = self.root / f"{name}-{attempt}.start.log"
            with log.open("w") as f:
                proc = subprocess.Popen(argv, start_new_session=True, env=self._node_env(), stdout=f,
                                        stderr=subprocess.STDOUT)
                rc = proc.wait(240)
            if rc == 0:
                node = Node(name, proc.pid, ports, cpus)
                self.nodes[name] = node
                return node
            for p in session_processes(proc.pid):
                try:
                    p.send_signal(signal.SIGKILL)
                except psutil.Error:
                    pass
        raise RuntimeError(f"ray start of {name} failed {attempts} times ({rc}):\n{log.read_text()[-3000:]}")

    def start(self) -> "LocalCluster":
        try:
            self._start("head", ["--head", f"--port={self.gcs_port}", f"--dashboard-port={self.dashboard_port}",
                                 f"--ray-client-server-port={self.client_port}", "--dashboard-host=127.0.0.1",
                                 f"--include-dashboard={str(self.dashboard).lower()}",
                                 *([f"--resources={json.dumps(self.head_resources)}"] if self.head_resources else [])],
                        self.head_cpus)
            extra = [f"--resources={json.dumps(self.worker_resources)}"] if self.worker_resources else []
            with ThreadPoolExecutor(self.n_workers or 1) as pool:  # the workers join at once
                started = [pool.submit(self._start, f"worker-{i}", [f"--address={self.address}", *extra],
                                       self.worker_cpus) for i in range(1, self.n_workers + 1)]
                for f in started:
                    f.result()
            self.wait_alive(len(self.nodes), 120)
        except BaseException:
            self.close()
            raise
        return self

    # ---------------------------------------------------------------- what the cluster sees

    def ray(self, *args: str, timeout: float = 120) -> str:
        """A ``ray`` CLI command against this cluster; its stdout."""
        out = subprocess.run([RAY, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(f"ray {' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        return out.stdout

    @staticmethod
    def _listed(out: str) -> list[dict]:
        """A ``ray list --format=json`` answer (it prints a sentence, not ``[]``, when nothing matches)."""
        return [] if out.startswith("No resource") else json.loads(out)

    def list_nodes(self) -> list[dict]:
        """The GCS's node table (``ray list nodes``): ``node_id``, ``state``, ``labels``..."""
        return self._listed(self.ray("list", "nodes", "--format=json", "--detail", "--limit=100"))

    def node_names(self) -> dict[str, str]:
        """node_id -> our name of it (its ``canopy-node`` label)."""
        self._names = {n["node_id"]: n.get("labels", {}).get("canopy-node", "?") for n in self.list_nodes()}
        return self._names

    def alive(self) -> set[str]:
        return {n.get("labels", {}).get("canopy-node", "?") for n in self.list_nodes() if n["state"] == "ALIVE"}

    def wait_alive(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if len(self.alive()) == n:
                    return
            except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError):
                pass
            time.sleep(1)
        raise RuntimeError(f"the cluster did not show {n} live nodes within {timeout} s")

    def wait_dead(self, name: str, timeout: float) -> float:
        """Seconds from ``name``'s kill until the GCS marks it DEAD."""
        node = self.nodes[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if name not in self.alive():
                    return time.monotonic() - node.killed_at
            except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{name} was not marked dead within {timeout} s")

    def list_actors(self, class_name: str | None = None, state: str | None = "ALIVE") -> list[dict]:
        """``ray list actors`` (of ``class_name``, in ``state``; None: any), each with ``node``:
        our name of the node it runs or ran on."""
        args = ["list", "actors", "--format=json", "--detail", "--limit=1000"]
        args += [f"--filter=class_name={class_name}"] if class_name else []
        args += [f"--filter=state={state}"] if state else []
        actors = self._listed(self.ray(*args))
        # each `ray list` is a process that imports Ray: ask for the nodes again only for one not seen
        names = self._names if all(a.get("node_id") in self._names for a in actors) else self.node_names()
        return [a | {"node": names.get(a.get("node_id"), "?")} for a in actors]

    def actors_by_node(self, class_name: str, state: str | None = "ALIVE") -> dict[str, int]:
        """How many actors of ``class_name`` each node holds (all states: None)."""
        counts: dict[str, int] = {}
        for a in self.list_actors(class_name, state):
            counts[a["node"]] = counts.get(a["node"], 0) + 1
        return counts

    # ---------------------------------------------------------------- losing a node

    def processes(self, name: str) -> list[psutil.Process]:
        return session_processes(self.nodes[name].sid)

    def running(self, marker: str) -> dict[str, int]:
        """Per live node, how many of its processes have ``marker`` in their title (Ray titles
        an actor's worker ``ray::Class``): where actors run, without asking the cluster."""
        counts = {}
        for name, node in self.nodes.items():
            if node.killed_at is not None:
                continue
            n = 0
            for p in self.processes(name):
                try:
                    n += marker in " ".join(p.cmdline())
                except psutil.Error:
                    continue
            if n:
                counts[name] = n
        return counts

    def kill(self, name: str) -> list[str]:
        """SIGKILL every process of node ``name`` at once (raylet, object manager, agents, and the
        worker processes of its tasks and actors), as when the machine loses power; ``"PID
        title"`` of each (Ray titles a worker ``ray::Class.method``)."""
        node = self.nodes[name]
        procs = self.processes(name)
        titles = []
        for p in procs:
            try:
                titles.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            except psutil.Error:
                titles.append(f"{p.pid} ?")
        node.killed_at = time.monotonic()
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        node.killed = titles
        return titles

    def left(self, name: str, timeout: float = 10) -> list[str]:
        """Processes of node ``name`` still alive ``timeout`` s after its kill (should be none)."""
        deadline = time.monotonic() + timeout
        while (procs := self.processes(name)) and time.monotonic() < deadline:
            time.sleep(0.2)
        return [f"{p.pid} {p.name()}" for p in procs]

    def close(self) -> None:
        """Every node's processes SIGKILLed, workers first; the temp dir removed."""
        for name in sorted(self.nodes, key=lambda n: n == "head"):
            for _ in range(3):  # a raylet may fork a worker while we kill: look again
                procs = self.processes(name)
                if not procs:
                    break
                for p in procs:
                    try:
                        p.send_signal(signal.SIGKILL)
                    except psutil.Error:
                        pass
                time.sleep(0.2)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
