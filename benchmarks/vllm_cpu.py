"""vLLM's CPU build against the local (transformers) engine, in one run, on the same prompts.

The prompts are CANOPY's own critic and reader calls: the in-process pipeline (configs/cpu.yaml,
the local engine) answers ``--n`` held-out HotpotQA questions over their candidate paragraphs
and every LLM call it makes is recorded. Then one Ray Serve instance runs two applications
built by ``build_app``: ``local`` (configs/cpu.yaml: the local ``LLMServer``) and ``vllm``
(configs/vllm-cpu.yaml: Ray Serve LLM's ``LLMServer`` on vLLM), and every recorded call is
replayed, streamed, to both ``/v1/chat/completions`` (the order alternates per call). Both are
SmolLM2-135M-Instruct in float32, greedy, under the same JSON schemas.

Reported per engine: start time (``serve.run`` of the application), prefill tokens/s (prompt
tokens over time to first token), decode tokens/s (completion tokens after the first over the
rest), critic and reader latency per question, replies equal to the local engine's, and the
memory of the LLM deployment's processes (the replica and, for vLLM, its engine processes).

    python benchmarks/vllm_cpu.py --n 20 --out results/bench/vllm_cpu.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import httpx
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from floor import free_port  # noqa: E402
from unseen_compress import held_out_questions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ENGINES = {"local": "configs/cpu.yaml", "vllm": "configs/vllm-cpu.yaml"}


class Recorder:
    """A ChatClient that records each call (role, request) and forwards it to ``inner``."""

    def __init__(self, inner, calls: list, question: str):
        self.inner, self.calls, self.question, self.model = inner, calls, question, inner.model

    def _record(self, messages, response_format, max_tokens):
        name = ((response_format or {}).get("json_schema") or {}).get("name", "text")
        self.calls.append({"question": self.question, "role": name.removeprefix("canopy_"),
                           "messages": [dict(m) for m in messages], "response_format": response_format,
                           "max_tokens": max_tokens})

    def chat(self, messages, *, response_format=None, max_tokens=None):
        self._record(messages, response_format, max_tokens)
        return self.inner.chat(messages, response_format=response_format, max_tokens=max_tokens)

    async def achat(self, messages, *, response_format=None, max_tokens=None):
        self._record(messages, response_format, max_tokens)
        return await self.inner.achat(messages, response_format=response_format, max_tokens=max_tokens)


def record_calls(n: int) -> list[dict]:
    """The critic/reader calls the in-process pipeline makes for ``n`` held-out questions."""
    from canopy_ray.compressor import Compressor
    from canopy_ray.config import load_config
    from canopy_ray.core.items import parse_item
    from canopy_ray.models.encoder import build_encoder
    from canopy_ray.models.llm import client_from_config
    from canopy_ray.models.llm.tokens import token_counter
    from canopy_ray.pipeline import LocalBackends, MemoryRetriever, Pipeline, Settings

    cfg = load_config(ROOT / ENGINES["local"])
    encoder, client, count = build_encoder(cfg.models), client_from_config(cfg.llm), token_counter(cfg.llm)
    calls: list[dict] = []
    for q, items in tqdm(held_out_questions(n), desc="recording the pipeline's LLM calls"):
        comp = Compressor.from_config(cfg, encoder, count_tokens=count)
        parsed = [parse_item(it) for it in items]
        backends = LocalBackends(encoder, MemoryRetriever(parsed, encoder, comp), comp,
                                 Recorder(client, calls, q.question))
        Pipeline(backends, Settings.from_config(cfg), count).answer_sync(q.question)
    return calls


def stream_call(url: str, model: str, call: dict) -> dict:
    """One call, streamed: time to first content token, total time, tokens and the reply."""
    from canopy_ray.models.llm.protocol import build_request

    body = build_request(model, call["messages"], response_format=call["response_format"],
                         max_tokens=call["max_tokens"])
    body.update(stream=True, stream_options={"include_usage": True})
    text, first, usage = [], None, None
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                piece = choice["delta"].get("content")
                if piece:
                    first = first or time.perf_counter() - t0
                    text.append(piece)
    total = time.perf_counter() - t0
    return {"text": "".join(text), "ttft": first or total, "total": total,
            "prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"]}


def llm_memory(app: str) -> dict:
    """RSS and USS (MiB) of the app's LLMServer replica and every process under it."""
    import psutil
    from ray.util.state import list_actors

    pids = [a.pid for a in list_actors(filters=[("state", "=", "ALIVE")], limit=1000)
            if a.class_name.startswith(f"ServeReplica:{app}:LLMServer")]
    procs = [p for pid in pids for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]]
    infos = [p.memory_full_info() for p in procs]
    return {"processes": len(procs), "rss_mib": sum(i.rss for i in infos) / 2**20,
            "uss_mib": sum(i.uss for i in infos) / 2**20}


def summarise(results: list[dict], calls: list[dict]) -> dict:
    per_q: dict = defaultdict(lambda: defaultdict(float))
    for call, res in zip(calls, results):
        per_q[call["question"]][call["role"]] += res["total"]
    prompt = sum(r["prompt_tokens"] for r in results)
    decoded = sum(max(0, r["completion_tokens"] - 1) for r in results)
    return {
        "prefill_tps": prompt / sum(r["ttft"] for r in results),
        "decode_tps": decoded / max(1e-9, sum(r["total"] - r["ttft"] for r in results)),
        "critic_s": [q.get("critic", 0.0) for q in per_q.values()],
        "reader_s": [q.get("reader", 0.0) for q in per_q.values()],
        "prompt_tokens": prompt, "completion_tokens": sum(r["completion_tokens"] for r in results),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20, help="held-out HotpotQA questions")
    ap.add_argument("--out", default="results/bench/vllm_cpu.md")
    args = ap.parse_args()

    import ray
    from ray import serve

    from canopy_ray.config import load_config
    from canopy_ray.serve import build_app

    calls = record_calls(args.n)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    urls, models, start_s = {}, {}, {}
    for name, path in ENGINES.items():
        cfg = load_config(ROOT / path)
        t0 = time.perf_counter()
        serve.run(build_app({"cfg": cfg}), name=name, route_prefix=f"/{name}")
        start_s[name] = time.perf_counter() - t0
        urls[name] = f"http://127.0.0.1:{port}/{name}"
        models[name] = httpx.get(f"{urls[name]}/v1/models", timeout=60).json()["data"][0]["id"]
        stream_call(urls[name], models[name], calls[0])  # one warm-up call each
    results: dict[str, list[dict]] = {name: [] for name in ENGINES}
    for i, call in enumerate(tqdm(calls, desc="replaying on both engines")):
        for name in (list(ENGINES) if i % 2 == 0 else list(ENGINES)[::-1]):
            results[name].append(stream_call(urls[name], models[name], call))
    memory = {name: llm_memory(name) for name in ENGINES}
    serve.shutdown()
    ray.shutdown()

    report = write_report(args, calls, results, memory, start_s)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(report)
    print(report)


def write_report(args, calls, results, memory, start_s) -> str:
    stats = {name: summarise(res, calls) for name, res in results.items()}
    equal = [a["text"] == b["text"] for a, b in zip(results["local"], results["vllm"])]
    roles = defaultdict(int)
    for c in calls:
        roles[c["role"]] += 1
    med = statistics.median
    lines = [
        "# vLLM (CPU build) against the local transformers engine",
        "",
        f"`python benchmarks/vllm_cpu.py --n {args.n} --out {args.out}`: {args.n} held-out HotpotQA questions, "
        f"{len(calls)} LLM calls ({', '.join(f'{v} {k}' for k, v in sorted(roles.items()))}) recorded from the "
        "in-process pipeline (configs/cpu.yaml) and replayed, streamed, through `/v1/chat/completions` of two "
        "Serve applications in one Ray instance: `local` (configs/cpu.yaml) and `vllm` (configs/vllm-cpu.yaml). "
        "SmolLM2-135M-Instruct, float32, greedy, the calls' JSON schemas; calls one at a time, the order "
        "alternating. Times are ratios within this run only (other work shared the two cores).",
        "",
        "| engine | start (s) | prefill tok/s | decode tok/s | critic s/question (median / mean) | "
        "reader s/question (median / mean) | LLM processes | RSS MiB | USS MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in ENGINES:
        s, m = stats[name], memory[name]
        lines.append(f"| {name} | {start_s[name]:.0f} | {s['prefill_tps']:.0f} | {s['decode_tps']:.1f} | "
                     f"{med(s['critic_s']):.2f} / {statistics.mean(s['critic_s']):.2f} | "
                     f"{med(s['reader_s']):.2f} / {statistics.mean(s['reader_s']):.2f} | {m['processes']} | "
                     f"{m['rss_mib']:.0f} | {m['uss_mib']:.0f} |")
    loc, vl = stats["local"], stats["vllm"]
    lines += [
        "",
        f"- vLLM / local: prefill x{vl['prefill_tps'] / loc['prefill_tps']:.2f}, decode "
        f"x{vl['decode_tps'] / loc['decode_tps']:.2f}, critic time per question x"
        f"{statistics.mean(vl['critic_s']) / max(1e-9, statistics.mean(loc['critic_s'])):.2f}, reader x"
        f"{statistics.mean(vl['reader_s']) / max(1e-9, statistics.mean(loc['reader_s'])):.2f} (means).",
        f"- Replies equal to the local engine's: {sum(equal)} of {len(equal)}; prompt tokens "
        f"{loc['prompt_tokens']} (local) vs {vl['prompt_tokens']} (vLLM), completion tokens "
        f"{loc['completion_tokens']} vs {vl['completion_tokens']}.",
    ]
    diffs = [(c, a["text"], b["text"]) for c, a, b, e in zip(calls, results["local"], results["vllm"], equal) if not e]
    for call, a, b in diffs[:3]:
        lines.append(f"  - {call['role']}: local `{a[:160]}` / vLLM `{b[:160]}`")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
