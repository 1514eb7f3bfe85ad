"""The evaluation's reader calls through Ray Data LLM (one batch) against calls through Serve.

``canopy eval`` on held-out HotpotQA (given setting, configs/cpu.yaml) makes one LLM call per
question, the reader's: k = 10 retrieves all ten candidates in the first round, so the critic
never runs. This builds ``--n`` of those reader calls exactly as ``canopy eval`` does (``Runner``
over the eval set, with a client that records each call and answers it empty), then sends them,
in one Ray instance, to vLLM's CPU build configured by configs/vllm-cpu.yaml (SmolLM2-135M-Instruct,
float32, greedy, the reader's JSON schema and ``max_tokens``):

- ``serve, one at a time``: the Serve application ``build_app`` makes of configs/vllm-cpu.yaml,
  through the client ``canopy eval --llm-url`` builds (``OpenAIHTTPClient``), one call after
  another, as the evaluation calls it;
- ``serve, all in flight``: the same calls sent together (``achat``), vLLM batching them itself;
- ``ray.data.llm``: ``build_processor(vLLMEngineProcessorConfig(...))`` over a dataset of the
  calls, with the engine arguments Serve's deployment gets (``llm_config_dict``); its engine
  starts inside the run.

Reported per path: engine start, generation time, prompts/s, and whether each reply equals the
one-at-a-time reply. Times are ratios within one run.

    CANOPY_SHARED_DATA=../shared/data python benchmarks/vllm_batch.py --n 30 --out results/bench/vllm_batch.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from floor import SHARED, free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class Recorder:
    """A chat client that records every call (role, messages, JSON schema, max_tokens) and
    answers it with an empty reply of the right shape: the prompts, no model."""

    model = "recorder"

    def __init__(self):
        self.calls: list[dict] = []

    def chat(self, messages, *, response_format=None, max_tokens=None):
        from canopy_ray.models.llm.protocol import ChatResult

        name = response_format["json_schema"]["name"].removeprefix("canopy_")
        self.calls.append({"role": name, "messages": [dict(m) for m in messages], "max_tokens": max_tokens,
                           "response_format": response_format})
        empty = {"reader": '{"answer": ""}', "critic": '{"sufficient": true, "missing": "", "next_query": ""}'}
        return ChatResult(empty.get(name, "{}"), "stop")

    async def achat(self, messages, *, response_format=None, max_tokens=None):
        return self.chat(messages, response_format=response_format, max_tokens=max_tokens)


def eval_calls(n: int) -> tuple[list[dict], int]:
    """The reader calls ``canopy eval --n N --split test`` makes on the shared HotpotQA set, and
    how many critic calls it made (none when k covers the candidates)."""
    from canopy_ray.config import load_config
    from canopy_ray.data.sets import prepare_shared
    from canopy_ray.eval.methods import parse_methods
    from canopy_ray.eval.runs import Runner, load_eval_set

    if not (SHARED / "hotpotqa").is_dir():
        raise SystemExit(f"needs the shared HotpotQA data at {SHARED} (set CANOPY_SHARED_DATA)")
    d = prepare_shared(SHARED, ROOT / "runs" / "bench-data", ["hotpotqa"])["hotpotqa"]
    eval_set = load_eval_set("hotpotqa", d / "questions.jsonl", d / "corpus.jsonl", n=n, split="test")
    rec = Recorder()
    Runner(load_config(ROOT / "configs" / "cpu.yaml"), rec).run(eval_set, parse_methods("canopy")[0])
    return [c for c in rec.calls if c["role"] == "reader"], sum(c["role"] == "critic" for c in rec.calls)


def one_at_a_time(client, calls: list[dict]) -> list[str]:
    return [client.chat(c["messages"], response_format=c["response_format"], max_tokens=c["max_tokens"]).content
            for c in calls]


def all_in_flight(client, calls: list[dict]) -> list[str]:
    async def go():
        replies = await asyncio.gather(*[client.achat(c["messages"], response_format=c["response_format"],
                                                      max_tokens=c["max_tokens"]) for c in calls])
        await client.aclose()
        return [r.content for r in replies]

    return asyncio.run(go())


def _to_engine(row: dict) -> dict:
    """A dataset row -> the vLLM stage's input: the chat messages and greedy sampling under the
    reader's JSON schema (what vLLM's OpenAI server makes of the same chat request)."""
    return {"i": row["i"], "messages": row["messages"],
            "sampling_params": {"temperature": 0.0, "max_tokens": int(row["max_tokens"]),
                                "structured_outputs": {"json": json.loads(row["schema"])}}}


def _from_engine(row: dict) -> dict:
    return {"i": row["i"], "text": row["generated_text"], "llm_s": row["time_taken_llm"],
            "tokens": row["num_generated_tokens"]}


def ray_data(llm, calls: list[dict], batch_size: int) -> tuple[list[str], float]:
    """Every call through ``ray.data.llm``'s vLLM engine processor; the replies in order and the
    engine's generation time (the longest request of the batch, all submitted at once)."""
    import ray
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    from canopy_ray.models.llm.gpu import llm_config_dict

    served = llm_config_dict(llm)
    small = {"num_cpus": 0.1}  # the chat-template, tokenize and detokenize actors: light work on 2 cores
    config = vLLMEngineProcessorConfig(
        model_source=served["model_loading_config"]["model_source"], engine_kwargs=served["engine_kwargs"],
        placement_group_config=served.get("placement_group_config"),  # CPU: no GPU asked for
        batch_size=batch_size, concurrency=1, log_engine_metrics=False,
        chat_template_stage=small, tokenize_stage=small, detokenize_stage=small)
    # the pre/post-processing tasks ask 1 CPU each by default: beside the engine's CPU on 2 cores
    # they would never be scheduled
    processor = build_processor(config, preprocess=_to_engine, postprocess=_from_engine,
                                preprocess_map_kwargs=small, postprocess_map_kwargs=small)
    rows = [{"i": i, "messages": c["messages"], "max_tokens": c["max_tokens"],
             "schema": json.dumps(c["response_format"]["json_schema"]["schema"])} for i, c in enumerate(calls)]
    out = sorted(processor(ray.data.from_items(rows)).take_all(), key=lambda r: r["i"])
    return [r["text"] for r in out], max(r["llm_s"] for r in out)


def report(args, n_calls: int, critics: int, rows: list[dict]) -> str:
    ref = rows[0]
    lines = [
        "# The evaluation's reader calls: Ray Data LLM against Serve (vLLM CPU build)",
        "",
        f"`CANOPY_SHARED_DATA=../shared/data python benchmarks/vllm_batch.py --n {args.n}`: the {n_calls} reader "
        f"calls `canopy eval --n {args.n} --split test` makes on the shared HotpotQA set (configs/cpu.yaml, "
        f"given setting; {critics} critic calls: k = 10 covers each question's candidates), sent in one Ray "
        "instance to vLLM's CPU build as configs/vllm-cpu.yaml configures it (SmolLM2-135M-Instruct, float32, "
        "greedy, the reader's JSON schema, max_tokens 48). `serve`: the application `build_app` makes of "
        "configs/vllm-cpu.yaml, through the client `canopy eval --llm-url` uses; `ray.data.llm`: "
        f"`build_processor(vLLMEngineProcessorConfig(...))`, one batch of {args.batch_size or n_calls}, the same engine "
        "arguments. Engine start for Serve is `serve.run` of the whole application; for Ray Data, what the run "
        "spends besides generating (actors, engine, chat template and tokenizer stages). Times are ratios "
        "within this run only. The all-in-flight pass runs after the one-at-a-time pass on the same engine, "
        "whose prefix cache may still hold some of the prompts: its gain is an upper bound. The Ray Data "
        "engine starts cold.",
        "",
        "| path | engine start (s) | generation (s) | prompts/s (generation) | total (s) | prompts/s (total) | "
        "equal to one at a time |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        same = sum(a == b for a, b in zip(r["texts"], ref["texts"]))
        total = r["start_s"] + r["gen_s"]
        lines.append(f"| {r['path']} | {r['start_s']:.0f} | {r['gen_s']:.1f} | {n_calls / r['gen_s']:.2f} | "
                     f"{total:.0f} | {n_calls / total:.2f} | {same}/{n_calls} |")
    lines.append("")
    for r in rows[1:]:
        lines.append(f"- {r['path']} / one at a time: generation x{r['gen_s'] / ref['gen_s']:.2f}, total "
                     f"x{(r['start_s'] + r['gen_s']) / (ref['start_s'] + ref['gen_s']):.2f}.")
        for a, b in [(a, b) for a, b in zip(r["texts"], ref["texts"]) if a != b][:3]:
            lines.append(f"  - differs: `{a[:120]}` / one at a time `{b[:120]}`")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=30, help="held-out HotpotQA questions (one reader call each)")
    ap.add_argument("--batch-size", type=int, default=None, help="Ray Data batch size (default: all calls)")
    ap.add_argument("--out", default="results/bench/vllm_batch.md")
    args = ap.parse_args()

    import httpx
    import ray
    from ray import serve

    from canopy_ray.config import load_config
    from canopy_ray.models.llm import client_from_config
    from canopy_ray.quickstart import reader_override
    from canopy_ray.serve import build_app

    calls, critics = eval_calls(args.n)
    print(f"{len(calls)} reader calls, {critics} critic calls", flush=True)
    vcfg = load_config(ROOT / "configs" / "vllm-cpu.yaml", serve={"replica_cpus": 0.1})
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        t0 = time.perf_counter()
        serve.run(build_app({"cfg": vcfg}), name="vllm", route_prefix="/vllm")
        start_s = time.perf_counter() - t0
        url = f"http://127.0.0.1:{port}/vllm/v1"
        httpx.get(f"{url}/models", timeout=60).raise_for_status()
        client = client_from_config(vcfg.override(llm={**reader_override(url), "timeout_s": 600}).llm)
        client.chat([{"role": "user", "content": "Hi"}], max_tokens=4)  # the engine's one-off costs
        for path, run in [("serve, one at a time", one_at_a_time), ("serve, all in flight", all_in_flight)]:
            t0 = time.perf_counter()
            texts = run(client, calls)
            rows.append({"path": path, "start_s": start_s, "gen_s": time.perf_counter() - t0, "texts": texts})
            print(rows[-1]["path"], f"{rows[-1]['gen_s']:.1f} s", flush=True)
        serve.shutdown()  # one engine at a time in memory
        t0 = time.perf_counter()
        texts, gen_s = ray_data(vcfg.llm, calls, args.batch_size or len(calls))
        total = time.perf_counter() - t0
        rows.append({"path": "ray.data.llm, one batch", "start_s": total - gen_s, "gen_s": gen_s, "texts": texts})
    finally:
        ray.shutdown()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report(args, len(calls), critics, rows))
    print(out.read_text())


if __name__ == "__main__":
    main()
