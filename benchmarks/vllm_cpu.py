"""vLLM's CPU build against the local (transformers) engine, in one run, on the same prompts.

One Ray Serve instance runs two applications built by ``build_app``: ``local``
(configs/cpu.yaml: the local ``LLMServer``) and ``vllm`` (configs/vllm-cpu.yaml: Ray Serve LLM's
``LLMServer`` on vLLM). The in-process pipeline (configs/cpu.yaml) answers ``--n`` held-out
HotpotQA questions over their candidate paragraphs; each critic and reader call it makes is sent,
streamed, to ``local``'s ``/v1/chat/completions`` (whose reply the pipeline goes on with) and then
the same request to ``vllm``'s. Both are SmolLM2-135M-Instruct in float32, greedy, under the same
JSON schemas. The report is rewritten after each question.

Reported per engine: start time (``serve.run`` of the application), prefill tokens/s (prompt
tokens over time to first token), decode tokens/s (completion tokens after the first over the
rest), critic and reader latency per question, replies equal to the local engine's, and the
memory of the LLM deployment's processes (the replica and, for vLLM, its engine processes).

    CANOPY_SHARED_DATA=../shared/data python benchmarks/vllm_cpu.py --n 20 --k 3 --out results/bench/vllm_cpu.md
"""

from __future__ import annotations

import argparse
import asyncio
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


def stream_call(url: str, model: str, call: dict) -> dict:
    """One call, streamed: time to first content token, total time, tokens, the reply and why it ended."""
    from canopy_ray.models.llm.protocol import build_request

    body = build_request(model, call["messages"], response_format=call["response_format"],
                         max_tokens=call["max_tokens"])
    body.update(stream=True, stream_options={"include_usage": True})
    text, first, usage, finish = [], None, None, "stop"
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
                finish = choice.get("finish_reason") or finish
                if choice["delta"].get("content"):
                    first = first or time.perf_counter() - t0
                    text.append(choice["delta"]["content"])
    total = time.perf_counter() - t0
    return {"text": "".join(text), "ttft": first or total, "total": total, "finish_reason": finish,
            "prompt_tokens": usage["prompt_tokens"], "completion_tokens": usage["completion_tokens"]}


class Measured:
    """A ChatClient for the pipeline: each call streamed to every engine in turn, the local
    engine's reply returned; ``log`` gets the call's question, role and each engine's numbers."""

    def __init__(self, urls: dict[str, str], models: dict[str, str], log: list, question: str):
        self.urls, self.models, self.log, self.question = urls, models, log, question
        self.model = models["local"]

    def chat(self, messages, *, response_format=None, max_tokens=None):
        from canopy_ray.models.llm.protocol import ChatResult

        name = ((response_format or {}).get("json_schema") or {}).get("name", "text")
        call = {"messages": [dict(m) for m in messages], "response_format": response_format, "max_tokens": max_tokens}
        out = {engine: stream_call(self.urls[engine], self.models[engine], call) for engine in self.urls}
        self.log.append({"question": self.question, "role": name.removeprefix("canopy_"), **out})
        ref = out["local"]
        return ChatResult(ref["text"], ref["finish_reason"], ref["prompt_tokens"], ref["completion_tokens"],
                          self.model, ref["total"])

    async def achat(self, messages, *, response_format=None, max_tokens=None):
        return await asyncio.to_thread(self.chat, messages, response_format=response_format, max_tokens=max_tokens)


def llm_memory(app: str) -> dict:
    """RSS and USS (MiB) of the app's LLMServer replica and every process under it (found among
    this process's descendants: a local Ray's raylet is one, its workers are under it)."""
    import psutil

    def title(p):
        try:
            return " ".join(p.cmdline())
        except psutil.Error:
            return ""

    replicas = [p for p in psutil.Process().children(recursive=True)
                if title(p).startswith(f"ray::ServeReplica:{app}:LLMServer")]
    procs = [q for p in replicas for q in [p, *p.children(recursive=True)]]
    infos = [p.memory_full_info() for p in procs]
    return {"processes": len(procs), "rss_mib": sum(i.rss for i in infos) / 2**20,
            "uss_mib": sum(i.uss for i in infos) / 2**20}


def summarise(log: list[dict], engine: str) -> dict:
    per_q: dict = defaultdict(lambda: defaultdict(float))
    for entry in log:
        per_q[entry["question"]][entry["role"]] += entry[engine]["total"]
    results = [entry[engine] for entry in log]
    return {
        "prefill_tps": sum(r["prompt_tokens"] for r in results) / sum(r["ttft"] for r in results),
        "decode_tps": sum(max(0, r["completion_tokens"] - 1) for r in results)
        / max(1e-9, sum(r["total"] - r["ttft"] for r in results)),
        "critic_s": [q.get("critic", 0.0) for q in per_q.values()],
        "reader_s": [q.get("reader", 0.0) for q in per_q.values()],
        "prompt_tokens": sum(r["prompt_tokens"] for r in results),
        "completion_tokens": sum(r["completion_tokens"] for r in results),
    }


def report(args, n_done: int, n: int, log: list[dict], memory: dict, start_s: dict) -> str:
    stats = {name: summarise(log, name) for name in ENGINES}
    equal = [e["local"]["text"] == e["vllm"]["text"] for e in log]
    roles: dict = defaultdict(int)
    for e in log:
        roles[e["role"]] += 1
    med, mean = statistics.median, statistics.mean
    lines = [
        "# vLLM (CPU build) against the local transformers engine",
        "",
        f"`CANOPY_SHARED_DATA=../shared/data python benchmarks/vllm_cpu.py --n {n} --k {args.k}`: {n_done} of {n} "
        f"held-out HotpotQA questions, {len(log)} LLM calls ({', '.join(f'{v} {k}' for k, v in sorted(roles.items()))}) "
        f"made by the in-process pipeline (configs/cpu.yaml, k = {args.k} of each question's candidates), each sent, streamed, to `/v1/chat/completions` of "
        "two Serve applications in one Ray instance: `local` (configs/cpu.yaml) and then `vllm` "
        "(configs/vllm-cpu.yaml). SmolLM2-135M-Instruct, float32, greedy, the calls' JSON schemas, one call at "
        "a time; both engines decode on one core (the local backend's `llm.threads: 1`; vLLM binds its "
        "OpenMP threads to all cores but one). Times are ratios within this run only: other work shared the "
        "two cores.",
        "",
        "| engine | start (s) | prefill tok/s | decode tok/s | critic s/question (median / mean) | "
        "reader s/question (median / mean) | LLM processes | RSS MiB | USS MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in ENGINES:
        s, m = stats[name], memory[name]
        lines.append(f"| {name} | {start_s[name]:.0f} | {s['prefill_tps']:.0f} | {s['decode_tps']:.1f} | "
                     f"{med(s['critic_s']):.2f} / {mean(s['critic_s']):.2f} | "
                     f"{med(s['reader_s']):.2f} / {mean(s['reader_s']):.2f} | {m['processes']} | "
                     f"{m['rss_mib']:.0f} | {m['uss_mib']:.0f} |")
    loc, vl = stats["local"], stats["vllm"]
    lines += [
        "",
        f"- vLLM / local: prefill x{vl['prefill_tps'] / loc['prefill_tps']:.2f}, decode "
        f"x{vl['decode_tps'] / loc['decode_tps']:.2f}, critic time per question "
        f"x{mean(vl['critic_s']) / max(1e-9, mean(loc['critic_s'])):.2f}, reader "
        f"x{mean(vl['reader_s']) / max(1e-9, mean(loc['reader_s'])):.2f} (means).",
        f"- Replies equal to the local engine's: {sum(equal)} of {len(equal)}; prompt tokens "
        f"{loc['prompt_tokens']} (local) vs {vl['prompt_tokens']} (vLLM), completion tokens "
        f"{loc['completion_tokens']} vs {vl['completion_tokens']} (vLLM also counts the end-of-turn token that "
        "closes a reply; the local engine stops on it uncounted).",
    ]
    for e in [e for e, same in zip(log, equal) if not same][:3]:
        lines.append(f"  - {e['role']}: local `{e['local']['text'][:160]}` / vLLM `{e['vllm']['text'][:160]}`")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20, help="held-out HotpotQA questions")
    ap.add_argument("--k", type=int, default=3, help="items retrieved per round: fewer than the 10 candidates, "
                    "so the critic runs (with all of them in the evidence the pipeline skips it)")
    ap.add_argument("--out", default="results/bench/vllm_cpu.md")
    args = ap.parse_args()

    import ray
    from ray import serve

    from canopy_ray.compressor import Compressor
    from canopy_ray.config import load_config
    from canopy_ray.core.items import parse_item
    from canopy_ray.models.encoder import build_encoder
    from canopy_ray.models.llm.tokens import token_counter
    from canopy_ray.pipeline import LocalBackends, MemoryRetriever, Pipeline, Settings
    from canopy_ray.serve import build_app

    questions = held_out_questions(args.n)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    urls, models, start_s = {}, {}, {}
    for name, path in ENGINES.items():
        # two graphs of seven replicas in 2 CPUs: Ray's accounting only, the replicas wait on requests
        app_cfg = load_config(ROOT / path, serve={"replica_cpus": 0.1})
        t0 = time.perf_counter()
        serve.run(build_app({"cfg": app_cfg}), name=name, route_prefix=f"/{name}")
        start_s[name] = time.perf_counter() - t0
        urls[name] = f"http://127.0.0.1:{port}/{name}"
        models[name] = httpx.get(f"{urls[name]}/v1/models", timeout=60).json()["data"][0]["id"]

    cfg = load_config(ROOT / ENGINES["local"], retrieval={"k": args.k})
    encoder, count = build_encoder(cfg.models), token_counter(cfg.llm)
    ask = [{"role": "user", "content": "Hi"}]
    Measured(urls, models, [], "warm-up").chat(ask, max_tokens=4)  # one-off costs of each engine
    log: list[dict] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        for i, (q, items) in enumerate(tqdm(questions, desc="questions (both engines)"), 1):
            comp = Compressor.from_config(cfg, encoder, count_tokens=count)
            retriever = MemoryRetriever([parse_item(it) for it in items], encoder, comp)
            backends = LocalBackends(encoder, retriever, comp, Measured(urls, models, log, q.question))
            Pipeline(backends, Settings.from_config(cfg), count).answer_sync(q.question)
            memory = {name: llm_memory(name) for name in ENGINES}
            out.write_text(report(args, i, len(questions), log, memory, start_s))
    finally:
        serve.shutdown()
        ray.shutdown()
    print(out.read_text())


if __name__ == "__main__":
    main()
