"""What compression costs through the Serve graph, against floors measured in the same run.

    python benchmarks/serve_load.py [--questions 40] [--repeats 200] [--node-encoder refiner|deployment]
                                    [--out results/bench/serve_load.md]

Part ``novel``: distinct questions, each with its gold paragraphs (HotpotQA test split from
``../shared/data`` when present, else the bundled sample's questions), sent to
``/v1/compress`` at concurrency 8 on a fresh server. The floor: a plain transformers loop
over the same model that encodes every node of those items' whole trees once, sorted by
length (target: the server finishes at least as fast).
Part ``repeat``: one such request sent ``--repeats`` times at concurrency 32, against a
trivial ingress -> ``@serve.batch`` graph started beside it (target: >= 0.25x its rate).
Part ``cache``: one question's items compressed in-process with node vectors from the
index's node store against encoding on the fly.
Ratios are what to read: absolute times differ from machine to machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from floor import free_port, plain_sorted_loop, question_items, start  # noqa: E402


async def _load(url: str, bodies: list[str], concurrency: int) -> dict:
    latencies: list[float] = []
    shed = [0]
    queue = list(reversed(bodies))
    async with httpx.AsyncClient(timeout=900) as client:
        async def worker():
            while queue:
                body = queue.pop()
                t0 = time.perf_counter()
                r = await client.post(url, content=body, headers={"content-type": "application/json"})
                if r.status_code in (429, 503) and "retry-after" in r.headers:
                    shed[0] += 1  # refused at once past the configured queues (docs/operations.md: Failure behaviour)
                    continue
                r.raise_for_status()
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    lat = np.array(latencies) * 1000
    return {"requests": len(lat), "shed": shed[0], "wall_s": wall, "rps": len(lat) / wall,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99))}


def _start(cfg_over: dict):
    from canopy_ray.config import load_config

    return start(load_config("configs/cpu.yaml", serve={"port": free_port(), **cfg_over},
                             llm={"backend": "openai", "url": "http://127.0.0.1:9/v1", "model": "unused"}))


def novel(questions: list[tuple[str, list[dict]]], node_encoder: str | None = None) -> dict:
    """Distinct requests at concurrency 8 on a fresh server vs the plain loop over their trees."""
    from ray import serve

    from canopy_ray.config import load_config
    from canopy_ray.core.evidence import piece
    from canopy_ray.core.hierarchy import build_tree
    from canopy_ray.core.items import parse_item

    cfg = load_config("configs/cpu.yaml")
    trees = [build_tree(parse_item(o), cfg.hierarchy.branching) for _, objs in questions for o in objs]
    texts = [piece(t, [n.span]).text for t in trees for n in t.nodes()]
    floor = plain_sorted_loop(texts, cfg.models.max_length)
    url = _start({"node_encoder": node_encoder} if node_encoder else {})
    warm = json.dumps({"query": "warm up", "items": [{"id": "w", "modality": "text", "text": "Warm up. Now."}]})
    asyncio.run(_load(url + "/v1/compress", [warm] * 4, 2))
    bodies = [json.dumps({"query": q, "items": objs}) for q, objs in questions]
    load = asyncio.run(_load(url + "/v1/compress", bodies, 8))
    stats = httpx.get(url + "/v1/config").json()["compression"]
    serve.shutdown()
    encoded = sum(v["encoded"] for v in stats["nodes"].values())
    return {"questions": len(questions), "nodes": len(texts), "nodes_encoded": encoded,
            "floor_s": floor["seconds"], "floor_tokens": floor["tokens"], "serve_s": load["wall_s"],
            "ratio": floor["seconds"] / load["wall_s"], "p50_ms": load["p50_ms"], "p99_ms": load["p99_ms"]}


def repeat(question: tuple[str, list[dict]], n: int) -> dict:
    """The same request at concurrency 32 vs a trivial batched Serve graph beside it."""
    from ray import serve

    url = _start({"max_inflight": 64})  # admit the whole burst: this part measures throughput, not shedding
    body = json.dumps({"query": question[0], "items": question[1]})
    asyncio.run(_load(url + "/v1/compress", [body] * 8, 4))
    canopy = asyncio.run(_load(url + "/v1/compress", [body] * n, 32))
    serve.shutdown()
    trivial = asyncio.run(_load(_start_trivial() + "/", [body] * n, 32))
    serve.shutdown()
    return {"requests": n, "shed": canopy["shed"], "canopy_rps": canopy["rps"], "canopy_p99_ms": canopy["p99_ms"],
            "trivial_rps": trivial["rps"], "ratio": canopy["rps"] / trivial["rps"]}


def _start_trivial() -> str:
    """Ingress -> a ``@serve.batch`` deployment that echoes: the Serve floor on this machine."""
    from ray import serve
    from starlette.requests import Request

    @serve.deployment(ray_actor_options={"num_cpus": 0.25})
    class Echo:
        @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005)
        async def echo(self, bodies: list[bytes]) -> list[int]:
            return [len(b) for b in bodies]

    @serve.deployment(ray_actor_options={"num_cpus": 0.25})
    class Front:
        def __init__(self, echo):
            self.echo = echo

        async def __call__(self, request: Request) -> dict:
            return {"n": await self.echo.echo.remote(await request.body())}

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(Front.bind(Echo.bind()), name="trivial", route_prefix="/")
    return f"http://127.0.0.1:{port}"


def cached_vs_fly(question: tuple[str, list[dict]], repeats: int = 10) -> dict:
    from canopy_ray.compressor import Compressor
    from canopy_ray.config import load_config
    from canopy_ray.core.items import parse_item
    from canopy_ray.index import load_index
    from canopy_ray.indexer import run_index
    from canopy_ray.models.encoder import build_encoder

    cfg = load_config("configs/cpu.yaml", models={"cache_mb": 0})  # the vector cache would hide the fly path
    query, objs = question
    items = [parse_item(o) for o in objs]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        corpus.write_text("".join(json.dumps(o) + "\n" for o in objs))
        run_index(cfg, corpus, Path(tmp) / "index", progress=False)
        store = load_index(Path(tmp) / "index").nodes
        enc = build_encoder(cfg.models)
        qvec = enc.encode_queries([query])[0]
        cached, fly = Compressor.from_config(cfg, enc, node_store=store), Compressor.from_config(cfg, enc)
        times = {}
        for name, comp in (("cached", cached), ("on the fly", fly)):
            comp.compress_items(qvec, items)  # warm up
            ts = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                res = comp.compress_items(qvec, items)
                ts.append(time.perf_counter() - t0)
            times[name] = statistics.median(ts)
        assert cached.stats["encoded"] == 0, "the cached path encoded something"
        assert [r.kept for r in cached.compress_items(qvec, items)] == [r.kept for r in res]
    return {"items": len(items), "nodes_scored": sum(len(r.scores) for r in res),
            "cached_ms": times["cached"] * 1000, "fly_ms": times["on the fly"] * 1000,
            "speedup": times["on the fly"] / times["cached"]}


def _table(title: str, columns: list[str], row: list[str]) -> list[str]:
    return ([title, ""] if title else []) + ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|",
                                             "| " + " | ".join(row) + " |", ""]


def tables(results: dict) -> str:
    lines = []
    if "novel" in results:
        r = results["novel"]
        lines += _table("Novel items: distinct questions with their gold paragraphs, /v1/compress at concurrency 8, "
                        "against a plain length-sorted loop encoding every node of their whole trees once.",
                        ["questions", "nodes (whole trees)", "nodes encoded by Serve", "plain loop s", "Serve s",
                         "ratio (>= 1 is the target)", "p50 ms", "p99 ms"],
                        [str(r["questions"]), str(r["nodes"]), str(r["nodes_encoded"]), f"{r['floor_s']:.1f}",
                         f"{r['serve_s']:.1f}", f"{r['ratio']:.2f}x", f"{r['p50_ms']:.0f}", f"{r['p99_ms']:.0f}"])
    if "repeat" in results:
        r = results["repeat"]
        lines += _table("One request repeated at concurrency 32, against a trivial ingress -> @serve.batch graph.",
                        ["requests", "shed (503)", "/v1/compress answered req/s", "p99 ms", "trivial graph req/s",
                         "ratio (>= 0.25 is the target)"],
                        [str(r["requests"]), str(r["shed"]), f"{r['canopy_rps']:.1f}", f"{r['canopy_p99_ms']:.0f}",
                         f"{r['trivial_rps']:.1f}", f"{r['ratio']:.2f}x"])
    if "cache" in results:
        r = results["cache"]
        lines += _table("", ["items", "nodes scored", "node store ms", "on the fly ms", "speed-up"],
                        [str(r["items"]), str(r["nodes_scored"]), f"{r['cached_ms']:.2f}", f"{r['fly_ms']:.1f}",
                         f"{r['speedup']:.0f}x"])
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--questions", type=int, default=40, help="distinct questions of the novel part")
    p.add_argument("--repeats", type=int, default=200, help="requests of the repeat part")
    p.add_argument("--parts", default="novel,repeat,cache", help="novel, repeat, cache (comma list)")
    p.add_argument("--out", default=None, help="also write the tables to this markdown file")
    p.add_argument("--node-encoder", choices=("refiner", "deployment"), default=None,
                   help="novel: serve.node_encoder (default: configs/cpu.yaml's)")
    args = p.parse_args(argv)
    import ray

    parts = set(args.parts.split(","))
    questions = question_items(args.questions)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    results = {}
    try:
        if "novel" in parts:
            results["novel"] = novel(questions, args.node_encoder)
            print(results["novel"], flush=True)
        if "repeat" in parts:
            results["repeat"] = repeat(questions[0], args.repeats)
            print(results["repeat"], flush=True)
        if "cache" in parts:
            results["cache"] = cached_vs_fly(questions[0])
    finally:
        ray.shutdown()
    table = tables(results)
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
