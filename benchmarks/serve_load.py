"""Load on /v1/compress, and cached vs on-the-fly node vectors, measured in one run.

    python benchmarks/serve_load.py [--requests-per-level 64] [--out results/serve_load.md]

Part 1 starts the real Serve graph on 127.0.0.1 twice (``@serve.batch`` on, then batch size
1) and sends /v1/compress requests (one HotpotQA question with two of its paragraphs each)
at concurrency 1, 8 and 32: throughput and p50/p99 latency.
Part 2 compresses one question's k = 10 items in-process with node vectors read from the
index's node store against encoding every node on the fly (target: cached >= 20x faster).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import tempfile
import time
from importlib import resources
from pathlib import Path

import httpx
import numpy as np


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def example() -> dict:
    return json.loads((resources.files("canopy_ray") / "assets" / "examples" / "demo.json").read_text())["examples"][0]


async def _load(url: str, bodies: list[str], concurrency: int) -> dict:
    latencies: list[float] = []
    queue = list(bodies)
    async with httpx.AsyncClient(timeout=600) as client:
        async def worker():
            while queue:
                body = queue.pop()
                t0 = time.perf_counter()
                r = await client.post(url, content=body, headers={"content-type": "application/json"})
                r.raise_for_status()
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    lat = np.array(latencies) * 1000
    return {"requests": len(lat), "rps": len(lat) / wall, "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99))}


def serve_load(n_per_level: int, levels=(1, 8, 32)) -> list[dict]:
    from ray import serve

    from canopy_ray.config import load_config
    from canopy_ray.serve import build_app

    ex = example()
    bodies = [json.dumps({"query": ex["query"], "items": ex["items"][i % 10:i % 10 + 2] or ex["items"][:2]})
              for i in range(n_per_level)]
    rows = []
    for label, qb, nb in (("@serve.batch", 32, 8), ("batch size 1", 1, 1)):
        port = _free_port()
        cfg = load_config("configs/cpu.yaml", serve={"port": port, "query_batch_size": qb, "node_batch_size": nb},
                          llm={"backend": "openai", "url": "http://127.0.0.1:9/v1", "model": "unused"})
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app({"cfg": cfg}), name="canopy", route_prefix="/")
        url = f"http://127.0.0.1:{port}/v1/compress"
        asyncio.run(_load(url, bodies[:4], 2))  # warm up
        for c in levels:
            rows.append({"batching": label, "concurrency": c, **asyncio.run(_load(url, bodies, c))})
            print(rows[-1], flush=True)
        serve.shutdown()
    return rows


def cached_vs_fly(repeats: int = 10) -> dict:
    from canopy_ray.compressor import Compressor
    from canopy_ray.config import load_config
    from canopy_ray.core.items import parse_item
    from canopy_ray.index import load_index
    from canopy_ray.indexer import run_index
    from canopy_ray.models.encoder import build_encoder

    cfg = load_config("configs/cpu.yaml")
    ex = example()
    items = [parse_item(o) for o in ex["items"]]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        corpus.write_text("".join(json.dumps(o) + "\n" for o in ex["items"]))
        run_index(cfg, corpus, Path(tmp) / "index", progress=False)
        store = load_index(Path(tmp) / "index").nodes
        enc = build_encoder(cfg.models)
        qvec = enc.encode_queries([ex["query"]])[0]
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
        assert cached.stats["misses"] == 0, "the cached path encoded something"
        assert [r.kept for r in cached.compress_items(qvec, items)] == [r.kept for r in res]
    nodes = sum(len(comp.tree(it).nodes()) for it in items)
    return {"items": len(items), "nodes": nodes, "cached_ms": times["cached"] * 1000,
            "fly_ms": times["on the fly"] * 1000, "speedup": times["on the fly"] / times["cached"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests-per-level", type=int, default=64)
    p.add_argument("--parts", default="load,cache", help="which parts to run: load, cache or both")
    p.add_argument("--out", default=None, help="also write the tables to this markdown file")
    args = p.parse_args(argv)
    import ray

    parts = set(args.parts.split(","))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    lines = []
    try:
        if "load" in parts:
            rows = serve_load(args.requests_per_level)
            lines += ["| batching | concurrency | requests | req/s | p50 ms | p99 ms |", "|---|---|---|---|---|---|"]
            lines += [f"| {r['batching']} | {r['concurrency']} | {r['requests']} | {r['rps']:.2f} | "
                      f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} |" for r in rows] + [""]
        if "cache" in parts:
            cv = cached_vs_fly()
            lines += ["| k items | nodes | cached ms | on the fly ms | speed-up |", "|---|---|---|---|---|",
                      f"| {cv['items']} | {cv['nodes']} | {cv['cached_ms']:.2f} | {cv['fly_ms']:.1f} | "
                      f"{cv['speedup']:.0f}x |"]
    finally:
        ray.shutdown()
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
