"""A job started as a user starts it (its own session, its own local Ray under a private temp
dir) that a test can SIGKILL: the driver's process group, one of its processes, or every
process of the run. Shared by the kill tests of the index job and of training."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import psutil


def unshare_ok() -> bool:
    """Whether this machine lets a test run commands in a PID namespace of their own (``unshare``):
    there ``ray stop`` sees only the Ray the test started."""
    if shutil.which("unshare") is None:
        return False
    try:
        probe = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "true"]
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def shell_text(path: Path) -> str:
    """A document's text with shell continuations joined and spaces collapsed, to find its
    commands in."""
    return re.sub(r"[ \t]+", " ", path.read_text().replace("\\\n", " "))


# exec a command with SIGINT at its default (an ignored SIGINT survives exec, and bash keeps it)
DEFAULT_SIGINT = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                  "os.execvp(sys.argv[1], sys.argv[1:])"]


def run_in_own_pids(script: list[str], work: Path, timeout: float, **env: str) -> str:
    """``script`` (bash lines, ``set -euo pipefail``, each traced with the seconds since the start,
    ``ray stop --force`` on any exit) in a PID namespace of its own, where ``ray stop`` sees only the
    Ray it started; ``--kill-child`` ends every process in it when the script ends or this test dies. No ``RAY_`` variable of the
    suite's leaks in; ``OUT`` is ``work``; SIGINT is at its default, as a terminal has it, however
    the suite was started (a process started with SIGINT ignored, e.g. ``nohup cmd &`` from a
    script, passes the ignore to every child, and bash cannot undo an inherited ignore, so a
    Ctrl-C sent by the script would be lost). The output; the test fails unless every line ran
    and the script exited 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | env
    env |= {"PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}", "OUT": str(work)}
    log = work / "sequence.log"
    cmd = DEFAULT_SIGINT + ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "bash", "-c",
                            "\n".join(["set -euo pipefail", "PS4='+ [${SECONDS}s] '", "set -x",  # each line, timed
                                       'trap \'ray stop --force > "$OUT/stop-trap.log" 2>&1 || true\' EXIT',
                                       *script, "trap - EXIT", "echo SEQUENCE-DONE"])]
    with log.open("w") as f:
        try:
            rc = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[2], env=env, stdout=f,
                                stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    out = log.read_text(errors="replace")
    assert rc == 0 and "SEQUENCE-DONE" in out, f"rc={rc}\n{out[-5000:]}"
    return out


class KillableJob:
    """``Popen(argv)`` with ``start_new_session=True``: the driver leads a session and a process
    group; Ray's daemons join its group, Ray's workers make groups of their own in the session,
    so the session id finds every process of the run and none of anyone else's."""

    def __init__(self, argv: list[str], log: Path, cwd: Path | None = None):
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="rk-", dir="/tmp"))  # short: Ray's socket paths
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env |= {"RAY_TMPDIR": str(self.ray_tmp), "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
        self.log = log
        with open(log, "w") as f:
            self.proc = subprocess.Popen(argv, start_new_session=True, env=env, cwd=cwd, stdout=f,
                                         stderr=subprocess.STDOUT)
        self.sid = self.proc.pid

    def processes(self) -> list[psutil.Process]:
        """The live processes of this run (zombies waiting to be reaped do not count)."""
        out = []
        for p in psutil.process_iter(["status"]):
            try:
                if os.getsid(p.pid) == self.sid and p.info["status"] != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except (OSError, psutil.Error):
                continue
        return out

    def find(self, marker: str) -> list[psutil.Process]:
        """Processes of this run whose title (Ray sets ``ray::Class.method``) holds ``marker``."""
        found = []
        for p in self.processes():
            try:
                if marker in " ".join(p.cmdline()):
                    found.append(p)
            except psutil.Error:
                continue
        return found

    def wait_for(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None:
                raise AssertionError(f"the job exited ({self.proc.returncode}) before {what}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout} s:\n{self.tail()}")
            time.sleep(0.05)

    def kill_group(self) -> None:
        """SIGKILL the driver's process group: the driver and Ray's daemons (GCS, raylet)."""
        os.killpg(self.sid, signal.SIGKILL)
        self.proc.wait()

    def kill_all(self) -> None:
        """SIGKILL every process of the run at once (no worker outlives the driver by a step)."""
        procs = self.processes()
        os.killpg(self.sid, signal.SIGKILL)
        for p in procs:
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        self.proc.wait()

    def left_after(self, timeout: float) -> list[str]:
        """Processes of the run still alive ``timeout`` s after its driver died, if any."""
        deadline = time.monotonic() + timeout
        while (left := self.processes()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return [f"{p.pid} {p.name()}" for p in left]

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job did not finish within {timeout} s:\n{self.tail()}") from None

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def close(self) -> None:
        """Leave nothing behind, whatever the test did."""
        if self.proc.poll() is None:
            os.killpg(self.sid, signal.SIGKILL)
            self.proc.wait()
        for p in self.processes():
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        shutil.rmtree(self.ray_tmp, ignore_errors=True)

    def __enter__(self) -> "KillableJob":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
