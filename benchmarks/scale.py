"""How retrieval cost grows with the corpus: N synthetic items through the index writer, searched
three ways, plus the approximate (ivf) form.

Per N (and dim), each step in its own process so that its peak memory is its own:

- ``build``: seeded clustered unit vectors (a Gaussian mixture in a 48-dimensional subspace
  plus full-dimensional noise, so neighbours are not confined to one cluster and approximate
  search is not trivially easy) and, up to ``--nodes-up-to`` items, ~6.6 synthetic node
  vectors per item, generated chunk by chunk into :class:`canopy_ray.index.writer.IndexWriter`
  (sharded fp16 form: FAISS shards, item table, node store, manifest; the time spent generating
  is reported apart). The floor, one FAISS fp16 index of the same vectors, is streamed from
  the shards' stored vectors to one file (``ShardFile``: the bytes ``faiss.write_index``
  writes); the ivf form goes from them through the same writer.
- ``floor``: FAISS directly on the one index (memory-mapped as the project maps its shards);
- ``sharded``: ``load_index`` (checksums verified) and the sharded search with its exact merge;
  recall against the floor's results on the same queries; node-store lookups and item fetches
  for k = 10 items;
- ``serve``: the ``Retriever`` deployment on a local Ray Serve (127.0.0.1), called over its handle
  one query at a time (batch 1) and 32 in flight; the replica's start-up and peak memory;
- ``ivf``: recall@10 against the floor and queries/s for a sweep of ``nprobe``, and at the ``nprobe``
  the index chose when it was written (the smallest whose recall@10 on a sample of its own vectors
  reaches ``retrieval.recall_target`` of ``configs/cpu.yaml``; what ``retrieval.nprobe: auto`` searches with).

``benchmarks/ivf_real.py`` measures ivf recall on real MiniLM vectors of the shared corpora beside
this mixture at the same sizes (``results/bench/ivf_real.json``), shown in ``scale.md`` too.

Results accumulate in ``results/bench/scale.json`` (one record per N and dim, one entry per step),
rendered to ``scale.md`` and ``scale.png`` after every step; ``--steps`` with no step renders the
stored results only. Times are wall-clock: compare the forms within one N (one run), and the
slopes across N.

    python benchmarks/scale.py --n 100000 1000000 --root /tmp/scale
    python benchmarks/scale.py --n 10000000 --root /tmp/scale --nodes-up-to 1000000
    python benchmarks/scale.py --n 1000000 --dim 2048 --root /tmp/scale --nodes-up-to 0
    python benchmarks/scale.py --steps          # render results/bench/scale.json again
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LATENT, CLUSTERS, SPREAD, NOISE = 48, 256, 1.0, 0.1
CHUNK, SEED, K = 250_000, 0, 10
SHARDS = 2  # configs/cpu.yaml's retrieval.shards
NPROBES = (4, 8, 16, 32, 64)
# Each step records its machine and the share of the machine's CPU time that other processes used
# while it ran (``hosts``). The records measured before that was recorded ran on this machine, with
# other work beside the steps named here (None: every step of the record):
LEGACY_MACHINE = "2 CPU cores, 24 GiB of memory, no GPU"
LEGACY_UNDER_LOAD = {"100000-384": None, "1000000-384": None, "1000000-2048": None,
                     "10000000-384": ("build_ivf", "ivf")}
OTHER_CPU = 0.2  # a step ran "under load" when other processes took more than this share of the CPU time


# ---- data ---------------------------------------------------------------------------------

def mixture(dim: int, seed: int = SEED):
    r = np.random.default_rng([seed, dim, 0])
    basis = np.linalg.qr(r.standard_normal((dim, LATENT)))[0].T.astype(np.float32)  # LATENT x dim
    centers = r.standard_normal((CLUSTERS, LATENT)).astype(np.float32)
    spread = (SPREAD * r.uniform(0.5, 1.5, CLUSTERS)).astype(np.float32)
    return basis, centers, spread


def vectors(mix, stream: int, n: int) -> np.ndarray:
    """``n`` unit vectors of chunk ``stream`` (any chunk can be made again on its own)."""
    basis, centers, spread = mix
    r = np.random.default_rng([SEED, 1, stream])
    c = r.integers(0, len(centers), n)
    z = centers[c] + spread[c, None] * r.standard_normal((n, LATENT), dtype=np.float32)
    x = z @ basis
    x += NOISE * r.standard_normal(x.shape, dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def chunks(n: int):
    for i, a in enumerate(range(0, n, CHUNK)):
        yield i, a, min(n, a + CHUNK)


def queries(mix, n: int) -> np.ndarray:
    return vectors(mix, 10**6, n)  # a stream no item chunk uses


def node_rows(n_items: int, stream: int, dim: int):
    """Per item ~6.6 nodes (2n - 1 for n leaves, n = 1 + Poisson(2.8)), synthetic distinct
    spans and fp16 unit vectors."""
    r = np.random.default_rng([SEED, 2, stream])
    counts = 2 * (1 + r.poisson(2.8, n_items)) - 1
    total = int(counts.sum())
    first = np.repeat(np.cumsum(counts) - counts, counts)
    j = np.arange(total) - first
    spans = np.stack([j, j + 1], axis=1).astype(np.int32)
    block = r.standard_normal((min(total, 65_536), dim), dtype=np.float32)
    block = (block / np.linalg.norm(block, axis=1, keepdims=True)).astype(np.float16)
    return counts, spans, np.resize(block, (total, dim))  # a block repeated: values do not change a lookup's cost


def item_columns(a: int, b: int):
    import pyarrow as pa

    ids = [f"syn-{i:09d}" for i in range(a, b)]
    items = [f'{{"id": "{i}", "modality": "text", "text": "Synthetic item {i}."}}' for i in ids]
    return pa.array(ids), pa.array(["text"] * (b - a)), pa.array(items)


# ---- measuring -------------------------------------------------------------------------------

def mem(pid: int | str = "self") -> dict:
    """Resident memory in GiB: total, anonymous (the process's own), file-backed (mapped files,
    shared through the page cache) and the peak (VmHWM)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[{"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "VmHWM": "peak"}[key]] = \
                round(int(val.split()[0]) / 2**20, 3)
    return out


def du(paths) -> int:
    return int(sum(p.stat().st_size for path in paths for p in ([path] if path.is_file() else path.rglob("*"))
                   if p.is_file()))


def timed_search(search, qs: np.ndarray, batch: int, budget_s: float, max_batches: int) -> dict:
    return timed({"x": search}, qs, batch, budget_s, max_batches)["x"]


def timed(searches: dict, qs: np.ndarray, batch: int, budget_s: float, max_batches: int, warm: bool = True) -> dict:
    """Per search: latency per call (p50/p99, ms) and queries/s over up to ``max_batches`` calls
    of ``batch`` queries (stopping after ``budget_s`` in all). Several searches take turns on
    the same batches, so a change in the machine's load hits them alike. A first call
    of each (``warm``: page faults, thread pools) is not counted."""
    for fn in searches.values() if warm else ():
        fn(qs[:batch])
    lat = {name: [] for name in searches}
    t0 = time.perf_counter()
    for b in range(max_batches):
        q = qs[(b * batch) % len(qs):][:batch]
        if len(q) < batch:
            q = qs[:batch]
        names = list(searches) if b % 2 == 0 else list(searches)[::-1]
        for name in names:
            t = time.perf_counter()
            searches[name](q)
            lat[name].append(time.perf_counter() - t)
        if time.perf_counter() - t0 > budget_s:
            break
    return {name: {"batch": batch, "calls": len(v), "qps": round(batch * len(v) / sum(v), 3),
                   "p50_ms": round(float(np.percentile(v, 50)) * 1e3, 3),
                   "p99_ms": round(float(np.percentile(v, 99)) * 1e3, 3)} for name, v in lat.items()}


def budgets(n: int) -> dict:
    """Queries per measurement, fewer as a flat scan grows (time on 2 cores is the limit)."""
    big = n >= 5_000_000
    return {"b1": (20 if big else 200, 60.0), "b32": (3 if big else 8, 90.0), "recall": 32 if big else 256}


# ---- steps -------------------------------------------------------------------------------------

def stored_rows(index_dir: Path, rows: np.ndarray) -> np.ndarray:
    """The stored (fp16) vectors of the sharded index's rows ``rows`` (sorted), as float32."""
    return np.concatenate([x[rows[(rows >= a) & (rows < a + len(x))] - a] for a, x in stored_vectors(index_dir)])


def recall_target() -> float:
    from canopy_ray.config import load_config

    return load_config(ROOT / "configs" / "cpu.yaml").retrieval.recall_target


def stored_vectors(index_dir: Path):
    """``(first row, float32 chunk)`` of the sharded index's vectors as stored: an fp16 code is the
    vector's fp16 components, read from the end of each shard file (no second generator pass)."""
    from canopy_ray.index.manifest import read_manifest

    m = read_manifest(index_dir)
    for e in m["shards"]:
        path, n = index_dir / e["file"], e["count"]
        codes = np.memmap(path, np.float16, "r", offset=path.stat().st_size - n * m["dim"] * 2, shape=(n, m["dim"]))
        for a in range(0, n, CHUNK):
            yield e["offset"] + a, np.asarray(codes[a:a + CHUNK], np.float32)


def step_build(n: int, dim: int, root: Path, form: str, nodes_up_to: int, nlist: int | None) -> dict:
    """``sharded``: generate and write; ``floor`` and ``ivf``: from the sharded index's stored
    vectors (the same fp16 values), so only the sharded build pays for generating."""
    import faiss

    from canopy_ray.index.manifest import IVF_RECALL
    from canopy_ray.index.shards import MMAP_FLAGS, RecallProbe, ShardFile, auto_nlist, sample_rows, train_size, trained
    from canopy_ray.index.writer import IndexWriter

    out, src = root / f"{form}-{n}-{dim}", root / f"sharded-{n}-{dim}"
    t0 = time.perf_counter()
    gen_s, extra = 0.0, {}
    if form == "floor":  # streamed: the bytes faiss.write_index writes for the whole index, one chunk in memory
        floor = ShardFile(out / "floor.faiss", trained(dim, "sq_fp16"))
        for _, x in stored_vectors(src):
            floor.add(x)
        floor.close(0)
    elif form == "ivf":
        nlist = nlist or auto_nlist(n)
        first = next(stored_vectors(src))[1]  # rows are drawn independently: a random sample of the corpus
        sample = first[sample_rows(len(first), train_size(nlist, n), SEED)]
        del first
        rows = RecallProbe.rows_for(n)
        probe = RecallProbe(rows, stored_rows(src, rows), recall_target())
        t = time.perf_counter()
        writer = IndexWriter(out, count=n, dim=dim, index_type="ivf", shards=SHARDS, sample=sample, nlist=nlist,
                             recall=probe)
        extra["train_s"] = round(time.perf_counter() - t, 2)
        for a, x in _progress(stored_vectors(src), n, form):
            writer.add(*item_columns(a, a + len(x)), x)
        m = writer.close(model_id="synthetic", encoder="synthetic", adapter_id="synthetic")
        extra.update(nlist=m["nlist"], ivf_recall=m[IVF_RECALL])
    else:
        mix = mixture(dim)
        with_nodes = n <= nodes_up_to
        total_nodes = sum(int(node_rows(b - a, i, 1)[0].sum()) for i, a, b in chunks(n)) if with_nodes else 0
        writer = IndexWriter(out, count=n, dim=dim, nodes=total_nodes, index_type="sq_fp16", shards=SHARDS)
        for i, a, b in _progress(chunks(n), n, form):
            t = time.perf_counter()
            cols, x = item_columns(a, b), vectors(mix, i, b - a)
            node = node_rows(b - a, i, dim) if with_nodes else (None, None, None)
            gen_s += time.perf_counter() - t
            writer.add(*cols, x, *node)
        m = writer.close(model_id="synthetic", encoder="synthetic", adapter_id="synthetic")
        extra = {"nodes": m["nodes"], "node_store": with_nodes}
        # the fp16 codes read back as stored are the generator's vectors in fp16
        shard = faiss.read_index(str(out / m["shards"][-1]["file"]), MMAP_FLAGS)
        a, x = next(stored_vectors(out))
        assert a == 0 and np.array_equal(faiss.read_index(str(out / m["shards"][0]["file"]), MMAP_FLAGS)
                                         .reconstruct_n(0, 5), x[:5]) and shard.ntotal == m["shards"][-1]["count"]
    secs = time.perf_counter() - t0
    return {"build_s": round(secs, 2), "generate_s": round(gen_s, 2), "disk_bytes": du([out]), "build_mem": mem(),
            **extra}


def _progress(it, n: int, form: str):
    from tqdm import tqdm

    return tqdm(it, total=-(-n // CHUNK), desc=f"write {form} {n:,}", unit="chunk", file=sys.stderr)


def recall(got: np.ndarray, want: np.ndarray) -> float:
    return round(float(np.mean([len(set(a[a >= 0]) & set(w)) / K for a, w in zip(got, want)])), 4)


def step_search(n: int, dim: int, root: Path) -> dict:
    """FAISS on the one index (the floor) and the sharded search, in one process, taking turns."""
    import faiss

    from canopy_ray.index import load_index
    from canopy_ray.index.shards import MMAP_FLAGS

    b = budgets(n)
    qs = queries(mixture(dim), max(b["recall"], 200))
    m0 = mem()
    t = time.perf_counter()
    floor = faiss.read_index(str(root / f"floor-{n}-{dim}" / "floor.faiss"), MMAP_FLAGS)
    res = {"floor": {"load_s": round(time.perf_counter() - t, 3), "mem_after_load": mem()}}
    out = root / f"sharded-{n}-{dim}"
    t = time.perf_counter()
    index = load_index(out, verify=True)
    sh = {"load_s": round(time.perf_counter() - t, 3), "mem_before_load": m0}
    t = time.perf_counter()
    load_index(out, verify=False)
    sh["load_noverify_s"] = round(time.perf_counter() - t, 3)
    sh["mem_after_load"] = mem()
    ways = {"floor": lambda q: floor.search(q, K), "sharded": lambda q: index.shards.search(q, K)}
    for name, kind in (("b1", 1), ("b32", 32)):
        got = timed(ways, qs, kind, b[name][1], b[name][0], warm=kind == 1)
        res["floor"][name], sh[name] = got["floor"], got["sharded"]
    want = floor.search(qs[:b["recall"]], K)[1]
    sh["recall_vs_floor"] = recall(index.shards.search(qs[:b["recall"]], K)[1], want)
    np.save(root / f"floor-{n}-{dim}" / "ids.npy", want)
    sh["ids_b1"] = timed_search(lambda q: index.search(q, K), qs, 1, b["b1"][1] / 3, b["b1"][0] // 4)
    rng = np.random.default_rng(7)
    picks = [[f"syn-{i:09d}" for i in rng.integers(0, n, K)] for _ in range(50)]
    t = time.perf_counter()
    index.items(picks[0])  # first fetch: reads the item column and sorts the ids once
    sh["fetch_first_s"] = round(time.perf_counter() - t, 3)
    sh["fetch_k10"] = _lat(lambda p: index.items(p), picks)
    if len(index.nodes):
        sh["nodes_k10"] = _lat(lambda p: [index.nodes.lookup(i) for i in p], picks)
    sh["mem_after_search"] = res["floor"]["mem_after_search"] = mem()  # one process: both maps
    res["sharded"] = sh
    return res


def _lat(fn, args) -> dict:
    fn(args[0])
    lat = []
    for a in args:
        t = time.perf_counter()
        fn(a)
        lat.append(time.perf_counter() - t)
    return {"calls": len(lat), "p50_ms": round(float(np.percentile(lat, 50)) * 1e3, 3),
            "p99_ms": round(float(np.percentile(lat, 99)) * 1e3, 3)}


def step_serve(n: int, dim: int, root: Path) -> dict:
    import tempfile

    import psutil
    import ray
    from ray import serve

    from canopy_ray.index import load_index
    from canopy_ray.serve.deployments import Retriever

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from floor import free_port

    b = budgets(n)
    out = root / f"sharded-{n}-{dim}"
    qs = queries(mixture(dim), 200)
    for attempt in range(3):  # Ray gives its raylet 30 s to start, which a busy machine can exceed
        try:
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                     _temp_dir=tempfile.mkdtemp(prefix="ray-scale-"))
            break
        except Exception as e:
            if attempt == 2 or "timed out during startup" not in str(e):
                raise
            ray.shutdown()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
        t = time.perf_counter()
        handle = serve.run(Retriever.options(max_ongoing_requests=64).bind(str(out)), name="scale",
                           route_prefix=None)
        res = {"start_s": round(time.perf_counter() - t, 3)}
        pid = next(p.pid for p in psutil.Process().children(recursive=True) if "Retriever" in " ".join(_cmd(p)))
        res["replica_mem_after_load"] = mem(pid)

        local = load_index(out, verify=False)  # the same mapped files: no second copy in memory

        def one(q):
            return handle.search.remote(q[0], K).result()

        def many(q):  # 32 requests in flight at once, one query each (the Retriever's API)
            return [r.result() for r in [handle.search.remote(v, K) for v in q]]

        got = timed({"serve": one, "sharded": lambda q: local.search(q, K)}, qs, 1, b["b1"][1], b["b1"][0])
        res["b1"], res["sharded_b1"] = got["serve"], got["sharded"]
        got = timed({"serve": many, "sharded": lambda q: local.search(q, K)}, qs, 32, b["b32"][1], b["b32"][0],
                    warm=False)
        res["b32"], res["sharded_b32"] = got["serve"], got["sharded"]
        res["replica_mem_after_search"] = mem(pid)
    finally:
        serve.shutdown()
        ray.shutdown()
    return res


def _cmd(p) -> list[str]:
    try:
        return p.cmdline()
    except Exception:  # a process gone since the listing
        return []


def step_ivf(n: int, dim: int, root: Path) -> dict:
    from canopy_ray.index import load_index

    b = budgets(n)
    qs = queries(mixture(dim), max(b["recall"], 200))
    t = time.perf_counter()
    index = load_index(root / f"ivf-{n}-{dim}", verify=True)
    res = {"load_s": round(time.perf_counter() - t, 3), "mem_after_load": mem(), "sweep": []}
    want = np.load(root / f"floor-{n}-{dim}" / "ids.npy")
    auto = load_index(root / f"ivf-{n}-{dim}", verify=False).shards.shards[0].nprobe  # nprobe: auto
    for nprobe in sorted({*NPROBES, auto}):
        sh = index.shards.set_nprobe(nprobe)
        _, pos = sh.search(qs[:b["recall"]], K)
        res["sweep"].append({"nprobe": nprobe, "recall_vs_floor": recall(pos, want), "chosen": nprobe == auto,
                             "b1": timed_search(lambda q: sh.search(q, K), qs, 1, 15.0, 200),
                             "b32": timed_search(lambda q: sh.search(q, K), qs, 32, 20.0, 8)})
    res["mem_after_search"] = mem()
    return res


STEPS = {"search": step_search, "serve": step_serve, "ivf": step_ivf}
FORMS = ("floor", "sharded", "ivf")
# what a record holds; anything else is left over from an older version of this script and is dropped
# when the results are saved
RECORD_KEYS = {"n", "dim", "hosts", *(f"build_{f}" for f in FORMS), "floor", "sharded", "serve", "ivf"}  # search: floor, sharded


# ---- driver ------------------------------------------------------------------------------------

def run_step(args, step: str, n: int, dim: int) -> tuple[dict, dict]:
    """One step in a fresh interpreter (its own peak memory); its record, and the machine it ran
    on with the share of the CPU time other processes took meanwhile (None off Linux)."""
    cmd = [sys.executable, __file__, "--step", step, "--n", str(n), "--dim", str(dim), "--root", str(args.root),
           "--nodes-up-to", str(args.nodes_up_to)] + (["--nlist", str(args.nlist)] if args.nlist else [])
    print(f"[scale] {step} N={n:,} dim={dim}", file=sys.stderr, flush=True)
    mark = uuid.uuid4().hex  # in the environment of the step and of every process it starts (Ray's too)
    mine = _MarkedCPU(mark)
    busy0, t = _busy_s(), time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "CANOPY_SCALE_STEP": mark})
    wall, busy, own = time.perf_counter() - t, _busy_s(), mine.stop()
    rec = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    # (not told for a step of under 5 s: the 0.2 s sampling is too coarse for it)
    other = None if busy is None or wall < 5 else max(0.0, busy - busy0 - own) / (wall * os.cpu_count())
    host = {"cpus": os.cpu_count(), "mem_gib": _mem_gib(), "other_cpu": None if other is None else round(other, 3)}
    print(f"[scale] {step} N={n:,} done in {wall:.0f} s (other processes: {host['other_cpu']} of the CPU)",
          file=sys.stderr, flush=True)
    return rec, host


class _MarkedCPU:
    """CPU seconds used by the processes whose environment holds ``CANOPY_SCALE_STEP=mark``,
    sampled from /proc every 0.2 s until :meth:`stop` (a process's last 0.2 s may be missed)."""

    def __init__(self, mark: str):
        import threading

        self._mark, self._seen, self._done = f"CANOPY_SCALE_STEP={mark}".encode(), {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while not self._done.wait(0.2) and os.path.isdir("/proc"):
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    if self._mark not in Path(f"/proc/{pid}/environ").read_bytes():
                        continue
                    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                self._seen[(pid, f[19])] = (int(f[11]) + int(f[12])) / tick  # utime + stime; f[19]: start time

    def stop(self) -> float:
        self._done.set()
        self._thread.join()
        return sum(self._seen.values())


def _busy_s() -> float | None:
    """CPU seconds the whole machine has spent busy (/proc/stat), or None."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except OSError:
        return None
    return (sum(f) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def _mem_gib() -> float | None:
    try:
        kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:"))
    except (OSError, StopIteration):
        return None
    return round(kib / 2**20, 1)


def save(results: dict, path: Path) -> None:
    for rec in results.values():
        for key in set(rec) - RECORD_KEYS:
            del rec[key]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, sort_keys=True))
    path.with_suffix(".md").write_text(report(results, path.with_suffix(".png")))


def report(results: dict, png: Path) -> str:
    recs = sorted(results.values(), key=lambda r: (r["dim"], r["n"]))
    g = lambda r, *ks: _get(r, ks)  # noqa: E731
    lines = [f"# Retrieval cost against corpus size ({'`python benchmarks/scale.py`'})", "",
             "Synthetic clustered unit vectors (seeded; a 256-component Gaussian mixture in a 48-dimensional "
             "subspace plus full-dimensional noise), written by `canopy_ray.index.writer.IndexWriter` "
             f"({SHARDS} fp16 shards, as `configs/cpu.yaml`), searched for k = {K}. Every number is measured, on "
             f"{_machines(results)}: compare forms within one N, and slopes across N. "
             + _load_note(results) +
             "Memory in GiB: `anon` is the process's own, `file` mapped index files (the page cache, shared by "
             "every process mapping them), `peak` the high-water mark (VmHWM, both kinds).", "",
             "## Build (one process per form; disk in GB = 1e9 bytes)", "",
             "| N | dim | form | build s | on disk GB | peak GiB (anon now) | notes |", "|---|---|---|---|---|---|---|"]
    for r in recs:
        for form in ("floor", "sharded", "ivf"):
            b = r.get(f"build_{form}")
            if not b:
                continue
            note = {"floor": "one FAISS fp16 index, one file",
                    "sharded": f"fp16 shards + items + node store ({b.get('nodes', 0):,} nodes)" if b.get("node_store")
                    else "fp16 shards + items (no node store)",
                    "ivf": f"nlist {b.get('nlist')}, trained in {b.get('train_s')} s" + _chosen(b)}[form]
            if "generate_s" not in b:
                note += "; the time includes generating the vectors"
            elif form == "sharded":
                note += f"; of which {b['generate_s']} s generating the synthetic rows"
            else:
                note += "; from the sharded index's stored vectors"
            lines.append(f"| {r['n']:,} | {r['dim']} | {form} | {b['build_s']} | {b['disk_bytes'] / 1e9:.2f} | "
                         f"{g(b, 'build_mem', 'peak')} ({g(b, 'build_mem', 'anon')}) | {note} |")
    lines += ["", "## Load and memory", "",
              "Shards are memory-mapped (`IO_FLAG_MMAP_IFC`): loading reads the manifest, verifies checksums "
              "(`load_index(verify=True)`, as the Retriever does) and maps the files; pages come in as searches "
              "touch them. The floor and the sharded index are loaded in one process (both mapped), so its "
              "memory after searching holds both; the Retriever replica and the ivf process map one index each.", "",
              "| N | dim | process | load s | after load: rss / anon / file | after searching: rss / anon / file | peak |",
              "|---|---|---|---|---|---|---|"]
    for r in recs:
        for step, label, lk, m0, m1 in (("floor", "FAISS, one index", "load_s", "mem_after_load", None),
                                        ("sharded", "load_index (verify), same process", "load_s", "mem_after_load",
                                         "mem_after_search"),
                                        ("serve", "Retriever replica (start)", "start_s", "replica_mem_after_load",
                                         "replica_mem_after_search"),
                                        ("ivf", "load_index ivf", "load_s", "mem_after_load", "mem_after_search")):
            x = r.get(step)
            if not x:
                continue
            mm = lambda m: f"{m.get('rss')} / {m.get('anon')} / {m.get('file')}" if m else "-"  # noqa: E731
            extra = f" (no verify {x['load_noverify_s']})" if "load_noverify_s" in x else ""
            lines.append(f"| {r['n']:,} | {r['dim']} | {label} | {x.get(lk)}{extra} | {mm(x.get(m0))} | "
                         f"{mm(x.get(m1)) if m1 else 'below'} | {g(x, m1, 'peak') if m1 else ''} |")
    lines += ["", "## Exact search: three ways", "",
              "batch 1: one query per call; batch 32: 32 queries per call (Serve: 32 single-query requests in "
              "flight, the Retriever's API). Each pair of ways takes turns on the same batches in one process, so "
              "compare within a pair. Recall: the sharded search's top-10 positions against the one index's on "
              "the same queries.", "",
              "| N | dim | way | b1 q/s | b1 p50 ms | b1 p99 ms | b32 q/s | b32 p50 ms | b32 p99 ms | recall |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        sv = r.get("serve") or {}
        for step, label, x in (("floor", "FAISS, one fp16 index (floor)", r.get("floor")),
                               ("sharded", "sharded + exact merge (taking turns with the floor)", r.get("sharded")),
                               ("ids", "CanopyIndex.search (ids, b1 only)", {"b1": g(r, "sharded", "ids_b1")}
                                if g(r, "sharded", "ids_b1") else None),
                               ("serve", "Serve Retriever over its handle", sv or None),
                               ("sharded2", "sharded, in the driver (taking turns with Serve)",
                                {"b1": sv["sharded_b1"], "b32": sv["sharded_b32"]} if "sharded_b1" in sv else None)):
            if not x:
                continue
            rec = x.get("recall_vs_floor", "1 (reference)" if step == "floor" else "-")
            lines.append(f"| {r['n']:,} | {r['dim']} | {label} | {g(x, 'b1', 'qps')} | {g(x, 'b1', 'p50_ms')} | "
                         f"{g(x, 'b1', 'p99_ms')} | {g(x, 'b32', 'qps')} | {g(x, 'b32', 'p50_ms')} | "
                         f"{g(x, 'b32', 'p99_ms')} | {rec} |")
    lines += ["", "## Approximate: ivf (fp16 codes in nlist lists, nprobe scanned)", "",
              "Recall@10 against the flat index (one FAISS fp16 index, the floor: its top-10 on the same queries). "
              "The 'x flat' columns divide the ivf's queries/s by the flat index's, as measured in the search step "
              "of the same N (exact search three ways, above) at the same batch size.", "",
              "| N | dim | nprobe | recall@10 | b1 q/s | b1 p50 ms | b32 q/s | b32 p50 ms | x flat (b1) | "
              "x flat (b32) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        for x in g(r, "ivf", "sweep") or []:
            chosen = " (chosen at indexing)" if x.get("chosen") else ""
            lines.append(f"| {r['n']:,} | {r['dim']} | {x['nprobe']}{chosen} | {x['recall_vs_floor']} | {x['b1']['qps']} | "
                         f"{x['b1']['p50_ms']} | {x['b32']['qps']} | {x['b32']['p50_ms']} | "
                         f"{_ratio(x['b1']['qps'], g(r, 'floor', 'b1', 'qps'))} | "
                         f"{_ratio(x['b32']['qps'], g(r, 'floor', 'b32', 'qps'))} |")
    lines += ["", "## Item fetch and node-store lookups, k = 10 items", "",
              "| N | dim | first fetch s (reads ids' order) | fetch p50 / p99 ms | node lookups p50 / p99 ms | nodes |",
              "|---|---|---|---|---|---|"]
    for r in recs:
        x = r.get("sharded")
        if not x:
            continue
        nk = x.get("nodes_k10")
        lines.append(f"| {r['n']:,} | {r['dim']} | {x.get('fetch_first_s')} | {g(x, 'fetch_k10', 'p50_ms')} / "
                     f"{g(x, 'fetch_k10', 'p99_ms')} | "
                     + (f"{nk['p50_ms']} / {nk['p99_ms']} | {g(r, 'build_sharded', 'nodes'):,} |" if nk
                        else "not built | 0 |"))
    lines += real_section(png.with_name("ivf_real.json"))
    lines += ["", "## Targets, per N", "",
              "Set for 10M x 384: the sharded search's recall 1.0 at >= 0.8x the flat index's q/s (b32); Serve "
              "adds <= 20% to the sharded search's p50 (b1, taking turns in one driver); ivf recall@10 >= 0.95 "
              "at >= 10x the flat index's q/s; the replica's peak RSS below two copies of the index (the fp16 "
              "codes: 2 x N x dim bytes).", "",
              "| N | dim | sharded recall | sharded / flat q/s (b32) | Serve adds to sharded p50 (b1) | fastest ivf "
              "with recall@10 >= 0.95: nprobe, x flat q/s (b1, b32) | replica peak RSS (anon) / fp16 codes GiB |",
              "|---|---|---|---|---|---|---|"]
    for r in recs:
        ok = [x for x in g(r, "ivf", "sweep") or [] if x["recall_vs_floor"] >= 0.95]
        best = max(ok, key=lambda x: x["b32"]["qps"]) if ok else None
        serve_add = _ratio(g(r, "serve", "b1", "p50_ms"), g(r, "serve", "sharded_b1", "p50_ms"), minus_one=True)
        peak, anon = (g(r, "serve", "replica_mem_after_search", k) for k in ("peak", "anon"))
        codes = 2 * r["n"] * r["dim"] / 2**30  # the fp16 item vectors, what a search maps
        lines.append(f"| {r['n']:,} | {r['dim']} | {g(r, 'sharded', 'recall_vs_floor')} | "
                     f"{_ratio(g(r, 'sharded', 'b32', 'qps'), g(r, 'floor', 'b32', 'qps'))} | {serve_add} | "
                     + (f"{best['nprobe']}, {_ratio(best['b1']['qps'], g(r, 'floor', 'b1', 'qps'))}, "
                        f"{_ratio(best['b32']['qps'], g(r, 'floor', 'b32', 'qps'))} | " if best
                        else ("none in the sweep | " if g(r, "ivf") else "- | "))
                     + (f"{peak} ({anon}) / {codes:.2f} |" if peak else "- |"))
    plot(recs, png)
    lines += ["", f"![cost against N]({png.name})", ""]
    return "\n".join(lines).replace("| None ", "| - ")


def _chosen(b: dict) -> str:
    m = b.get("ivf_recall")
    return (f"; nprobe {m['nprobe']} chosen at indexing (recall@10 {m['recall']} >= {m['target']} on {m['queries']} "
            f"of its own vectors)") if m else ""


def real_section(path: Path) -> list[str]:
    """ivf on real MiniLM vectors beside the mixture at the same sizes (``benchmarks/ivf_real.py``)."""
    if not path.is_file():
        return []
    d = json.loads(path.read_text())
    probes = sorted({int(p) for s in d["sets"].values() for p in s["real"]["own"]})
    lines = ["", "## ivf on real MiniLM vectors, beside the mixture (`python benchmarks/ivf_real.py "
             f"--items {d['items_per_corpus']}`)", "",
             f"A seeded sample of {d['items_per_corpus']} items of each shared corpus (capped: embedding is the "
             f"cost on CPU), embedded as the index job does with `{d['config']}` (items: f0, nodes: f_theta); "
             "'all' is the three samples in one index, as the open setting's. Beside each set, the mixture "
             "above drawn at the same N and dim (`real` / `mixture`). Recall@10 against exact fp32 search, "
             f"{d['shards']} shards, nlist by the auto rule: `own` queries are {d['own_queries']} of the set's own "
             f"vectors, or all of them when fewer (each one's nearest other rows, as an index measures itself); "
             f"`questions` are "
             f"{d['questions_per_corpus']} of the corpus's questions by f0 (the mixture: points of an unused "
             f"stream). 'chosen' is the nprobe the index picks for recall@10 >= {d['target']} on its own "
             "vectors.", "",
             "| set | vectors | N | nlist | queries | " + " | ".join(f"nprobe {p}" for p in probes)
             + " | chosen nprobe |", "|---|---|---|---|---|" + "---|" * (len(probes) + 1)]
    sets = sorted(d["sets"].values(), key=lambda s: (s["set"].startswith("all"), s["set"], s["kind"]))
    for s in sets:
        for q in ("own", "questions"):
            if not s["real"][q]:
                continue
            cells = [f"{s['real'][q].get(str(p), '-')} / {s['synthetic'][q].get(str(p), '-')}" for p in probes]
            chosen = (f"{s['real']['chosen_nprobe']} / {s['synthetic']['chosen_nprobe']}" if q == "own" else "")
            lines.append(f"| {s['set']} | {s['kind']} | {s['real']['n']:,} | {s['real']['nlist']} | {q} | "
                         + " | ".join(cells) + f" | {chosen} |")
    lines += ["", "How close the mixture is to real vectors (`real` / `mixture`): the share of variance in the top "
              "10 and 48 principal components; the median distance to the nearest other row and to the 10th, "
              "over the mean distance to all rows (lower: neighbours stand out more); the mean cosine to the "
              "set's mean direction (anisotropy); queries with an exact duplicate among the other rows.", "",
              "| set | vectors | N | PCA top 10 | PCA top 48 | NN1 / mean | NN10 / mean | cos to mean | duplicates |",
              "|---|---|---|---|---|---|---|---|---|"]
    for s in sets:
        r, m = s["real"]["shape"], s["synthetic"]["shape"]
        lines.append(f"| {s['set']} | {s['kind']} | {s['real']['n']:,} | "
                     + " | ".join(f"{r[k]} / {m[k]}" for k in ("pca_top10", "pca_top48", "nn1_over_mean",
                                                              "nn10_over_mean", "cos_to_mean", "duplicates")) + " |")

    def span(kind, side, *keys):
        v = [_get(s[side], keys) for s in sets if s["kind"] == kind]
        return f"{min(v)}-{max(v)}" if min(v) != max(v) else f"{v[0]}"

    harder = all(s["real"]["chosen_nprobe"] <= s["synthetic"]["chosen_nprobe"] for s in sets)
    nlists = sorted({s["real"]["nlist"] for s in sets})
    lines += ["", f"In short, at these sizes the mixture is {'' if harder else 'not uniformly '}harder for ivf than "
              "the real vectors. To reach "
              f"recall@10 >= {d['target']} the real item vectors needed nprobe {span('items', 'real', 'chosen_nprobe')} "
              f"(the mixture {span('items', 'synthetic', 'chosen_nprobe')}) and the node vectors "
              f"{span('nodes', 'real', 'chosen_nprobe')} (the mixture {span('nodes', 'synthetic', 'chosen_nprobe')}). "
              "The mixture keeps nearly all its variance in its 48-dimensional subspace "
              f"({span('items', 'synthetic', 'shape', 'pca_top48')} in 48 components) where real vectors spread "
              f"theirs ({span('items', 'real', 'shape', 'pca_top48')} for items, "
              f"{span('nodes', 'real', 'shape', 'pca_top48')} for nodes); real node vectors (f_theta) lie in a "
              f"narrow cone (cosine to their mean direction {span('nodes', 'real', 'shape', 'cos_to_mean')}, the "
              f"mixture {span('nodes', 'synthetic', 'shape', 'cos_to_mean')}) and have much nearer nearest "
              f"neighbours (NN1 / mean {span('nodes', 'real', 'shape', 'nn1_over_mean')} against "
              f"{span('nodes', 'synthetic', 'shape', 'nn1_over_mean')}). These N are small (the embedding is "
              f"capped), so nlist is {nlists[0]}-{nlists[-1]}: the synthetic figures above say how ivf scales with N, "
              "these compare the two kinds of vectors at one size. An ivf index measures its own recall when it is "
              "built, whatever its vectors (`retrieval.recall_target`)."]
    return lines


def _under_load(r: dict, step: str) -> bool:
    host = r.get("hosts", {}).get(step)
    if host is not None:
        return (host["other_cpu"] or 0) > OTHER_CPU
    key = f"{r['n']}-{r['dim']}"
    return key in LEGACY_UNDER_LOAD and (LEGACY_UNDER_LOAD[key] is None or step in LEGACY_UNDER_LOAD[key])


def _machines(results: dict) -> str:
    names = set()
    for r in results.values():
        hosts = r.get("hosts") or {}
        names |= {f"{h['cpus']} CPU cores, {h['mem_gib']} GiB of memory" for h in hosts.values()}
        if any(step not in hosts for step in _ran(r)):
            names.add(LEGACY_MACHINE)
    return ("one machine (" if len(names) == 1 else "several machines (") + "; ".join(sorted(names)) + ")"


def _ran(r: dict) -> list[str]:
    """The steps a record holds (the search step writes ``floor`` and ``sharded``)."""
    return [s for s in ("build_floor", "build_sharded", "build_ivf", "search", "serve", "ivf")
            if s in r or s == "search" and "floor" in r]


def _load_note(results: dict) -> str:
    loaded = []
    for r in sorted(results.values(), key=lambda r: (r["dim"], r["n"])):
        ran = _ran(r)
        mine = [s for s in ran if _under_load(r, s)]
        if mine:
            loaded.append(f"{'every step' if mine == ran else ' and '.join(mine)} at {r['n']:,} x {r['dim']}")
    if not loaded:
        return ""
    return (f"Measured with other work running on the machine (background load; for a step that recorded it, "
            f"other processes took more than {OTHER_CPU:.0%} of the CPU time): {'; '.join(loaded)}. Their times, and the Serve overhead most of all, are "
            "noisy; the other steps ran on the machine otherwise idle. ")


def _get(d, keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _ratio(a, b, minus_one: bool = False) -> str:
    if a is None or b is None or not b:
        return "-"
    return f"{(a / b - 1) * 100:+.0f}%" if minus_one else f"{a / b:.2f}x"


_MARKER_NAMES = {"o": "circle", "s": "square", "^": "triangle", "D": "diamond"}


def plot(recs: list[dict], png: Path) -> None:
    """Log-log against N: one colour per quantity, one marker per dim; an open marker where the
    step ran with other work on the machine (``_under_load``)."""
    from matplotlib.lines import Line2D

    from canopy_ray.plots import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(1, 3, figsize=(15, 6))
    markers = dict(zip(sorted({r["dim"] for r in recs}), "os^D"))
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]  # grey is for the keys

    def line(a, step, value, label, ls="-"):
        colour = palette[len(handles[a]) % len(palette)]
        for dim, marker in markers.items():
            pts = [(r["n"], value(r), _under_load(r, step)) for r in recs if r["dim"] == dim]
            pts = [p for p in pts if p[1]]
            if not pts:
                continue
            a.loglog([p[0] for p in pts], [p[1] for p in pts], ls=ls, color=colour, alpha=0.6)
            for n, y, loaded in pts:
                a.loglog([n], [y], marker=marker, ls="", color=colour, markersize=7,
                         markerfacecolor="white" if loaded else colour)
        handles[a].append(Line2D([], [], color=colour, ls=ls, marker="o", label=label))

    handles = {a: [] for a in ax}
    for form in FORMS:
        line(ax[0], f"build_{form}", lambda r, f=form: _get(r, (f"build_{f}", "build_s")),
             {"floor": "flat (one FAISS index)", "sharded": "sharded (incl. generating the rows)"}.get(form, form))
    line(ax[1], "serve", lambda r: _get(r, ("serve", "replica_mem_after_search", "peak")),
         "Retriever replica, peak RSS")
    line(ax[1], "serve", lambda r: _get(r, ("serve", "replica_mem_after_search", "anon")),
         "Retriever replica, anon", ls="--")
    line(ax[1], "build_floor", lambda r: (_get(r, ("build_floor", "disk_bytes")) or 0) / 2**30,
         "fp16 codes on disk (one file)", ls=":")
    line(ax[1], "build_sharded", lambda r: (_get(r, ("build_sharded", "disk_bytes")) or 0) / 2**30,
         "sharded dir on disk (node store to 1M x 384)", ls="-.")
    for step, label in (("floor", "flat (one FAISS index)"), ("sharded", "sharded + exact merge"),
                        ("serve", "Serve Retriever")):
        line(ax[2], "serve" if step == "serve" else "search", lambda r, s=step: _get(r, (s, "b1", "p50_ms")),
             f"{label}, p50")

    def ivf(r):
        ok = [x for x in _get(r, ("ivf", "sweep")) or [] if x["recall_vs_floor"] >= 0.95]
        return min(x["b1"]["p50_ms"] for x in ok) if ok else None

    line(ax[2], "ivf", ivf, "ivf, p50 (fastest nprobe with recall@10 >= 0.95)")
    fig.suptitle("markers: " + ", ".join(f"{_MARKER_NAMES[m]} dim {d}" for d, m in markers.items())
                 + "; open marker: measured under background load", fontsize=9)
    for a, title, yl in ((ax[0], "build time", "seconds"), (ax[1], "memory and disk", "GiB"),
                         (ax[2], "search latency, batch 1", "ms")):
        a.set_title(title)
        a.set_xlabel("items N")
        a.set_ylabel(yl)
        a.grid(True, which="both", alpha=0.3)
        a.legend(handles=handles[a], fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    save(fig, png, 110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--root", type=Path, default=Path("/tmp/canopy-scale"), help="where the indexes are written")
    ap.add_argument("--results", type=Path, default=ROOT / "results" / "bench" / "scale.json")
    ap.add_argument("--nodes-up-to", type=int, default=1_000_000, help="node store for N up to this")
    ap.add_argument("--nlist", type=int, default=None, help="ivf lists (default: retrieval.nlist's auto rule)")
    ap.add_argument("--forms", nargs="+", default=["sharded", "floor", "ivf"], help="indexes to build "
                    "(floor and ivf from the sharded one's vectors)")
    ap.add_argument("--steps", nargs="*", default=["build", "search", "serve", "ivf"],
                    help="steps to measure for each N; none: render the stored results only")
    ap.add_argument("--keep", action="store_true", help="keep the indexes of each N (default: removed)")
    ap.add_argument("--step", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.step:  # a child: one step, its record as the last line of stdout
        n = args.n[0]
        if args.step.startswith("build-"):
            rec = step_build(n, args.dim, args.root, args.step[6:], args.nodes_up_to, args.nlist)
        else:
            rec = STEPS[args.step](n, args.dim, args.root)
        print(json.dumps(rec))
        return
    results = json.loads(args.results.read_text()) if args.results.exists() else {}
    if not args.steps:  # render only
        save(results, args.results)
        return
    for n in args.n:
        key = f"{n}-{args.dim}"
        rec = results.setdefault(key, {"n": n, "dim": args.dim})
        for step in args.steps:
            if step == "build":
                for form in args.forms:
                    rec[f"build_{form}"], rec.setdefault("hosts", {})[f"build_{form}"] = run_step(
                        args, f"build-{form}", n, args.dim)
                    save(results, args.results)
            elif step == "search":
                out, rec.setdefault("hosts", {})[step] = run_step(args, step, n, args.dim)
                rec.update(out)
                save(results, args.results)
            elif step != "ivf" or "ivf" in args.forms:
                rec[step], rec.setdefault("hosts", {})[step] = run_step(args, step, n, args.dim)
                save(results, args.results)
        if not args.keep:
            import shutil

            for form in FORMS:
                shutil.rmtree(args.root / f"{form}-{n}-{args.dim}", ignore_errors=True)


if __name__ == "__main__":
    main()
