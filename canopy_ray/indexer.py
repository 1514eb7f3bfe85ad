"""The ``index`` verb: corpus -> FAISS shards + cached node embeddings, with Ray Data.

    from canopy_ray.config import load_config
    from canopy_ray.indexer import run_index
    summary = run_index(load_config("configs/cpu.yaml"), "corpus.jsonl", "runs/index")

Steps (everything under ``OUT/work`` is resumable state):

1. **Plan.** The corpus is cut into input shards of ``index.shard_items`` lines
   (``work/inputs/shard-NNNNN.parquet``); ``work/plan.json`` records the corpus checksum and
   every setting the embeddings depend on. Rerunning with a changed corpus or settings is
   refused (``overwrite=True`` starts over).
2. **Embed.** Ray Data reads the pending input shards, validates items (tasks), and embeds
   them in a callable-class actor pool (``ActorPoolStrategy(size=index.actors)``, each
   actor ``index.cpus_per_actor`` CPUs and ``index.num_gpus`` GPUs). The driver collects the
   rows of each input shard and writes ``work/parts/part-NNNNN.parquet`` atomically once
   the shard is complete. Killed at any point, a rerun skips the shards whose part exists.
3. **Build.** From the parts in shard order: bad rows and duplicate ids (the first line
   wins) go to ``report.json`` / ``skipped.jsonl``; the rest fill the FAISS shards, the item
   table and the node store; ``manifest.json`` is written last; ``summary.json`` says what
   the run did (items, nodes, skipped, items/s).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import os
import shutil
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from canopy_ray.config import CanopyConfig, ConfigError, load_config
from canopy_ray.index.ingest import (NodeEmbedder, corpus_files, fingerprint, read_and_validate,
                                     split_corpus)

log = logging.getLogger("canopy_ray.indexer")

WORK, INPUTS, PARTS, PLAN = "work", "inputs", "parts", "plan.json"
PART_COLUMNS = ("shard", "row", "file", "line", "id", "modality", "reason", "message", "item", "n_nodes", "spans",
                "node_vecs", "item_vec")


class IndexJobError(RuntimeError):
    pass


class SimulatedCrash(RuntimeError):
    """Raised by the ``crash_after_parts`` test hook, as if the job were killed."""


def _adapter_id(cfg: CanopyConfig) -> str:
    if not cfg.models.adapter:
        return "frozen"
    from canopy_ray.models.encoder import adapter_fingerprint

    return adapter_fingerprint(cfg.models.adapter)


def _settings(cfg: CanopyConfig, media_root: Path) -> dict:
    """Everything the per-item rows depend on; a change invalidates finished shards."""
    return {"models": {"encoder": cfg.models.encoder, "encoder_path": cfg.models.encoder_path,
                       "adapter_id": _adapter_id(cfg), "max_length": cfg.models.max_length},
            "hierarchy": cfg.hierarchy.model_dump(), "shard_items": cfg.index.shard_items,
            "media_root": str(media_root)}


def _plan(cfg: CanopyConfig, corpus: Path, out: Path, media_root: Path, overwrite: bool) -> dict:
    work = out / WORK
    files = corpus_files(corpus)
    plan_path = work / PLAN
    want = {"corpus": [str(f.resolve()) for f in files], "fingerprint": fingerprint(files),
            "settings": _settings(cfg, media_root)}
    if plan_path.exists():
        plan = json.loads(plan_path.read_text())
        same = all(plan.get(k) == want[k] for k in ("fingerprint", "settings"))
        if same:
            return plan
        if not overwrite:
            raise IndexJobError(
                f"{out} holds an unfinished or finished index of another corpus or other settings "
                f"(see {plan_path}); use a new output directory or overwrite=True (--overwrite)")
    if work.exists():
        shutil.rmtree(work)
    for name in ("manifest.json", "summary.json"):
        (out / name).unlink(missing_ok=True)
    work.mkdir(parents=True)
    counts = split_corpus(files, work / INPUTS, cfg.index.shard_items)
    plan = want | {"shard_rows": counts}
    tmp = plan_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(plan, indent=1))
    tmp.replace(plan_path)
    return plan


def _write_part(rows: list, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pa.Table.from_batches([b]) if isinstance(b, pa.RecordBatch) else b for b in rows]
    table = pa.concat_tables([t.select(list(PART_COLUMNS)) for t in tables]).sort_by("row")
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)


def _embed_pending(cfg: CanopyConfig, plan: dict, out: Path, media_root: Path, pending: list[int],
                   progress: bool, crash_after_parts: int | None) -> int:
    """Run the Ray Data pipeline over the pending input shards; return the rows computed."""
    import pyarrow as pa
    import ray

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = progress
    ctx.execution_options.preserve_order = False
    work = out / WORK
    files = [str(work / INPUTS / f"shard-{k:05d}.parquet") for k in pending]
    expected = {k: plan["shard_rows"][k] for k in pending}
    # Reading and validation are light and run as zero-CPU tasks: they must not wait behind the
    # embedding actors, which may hold every CPU (``read_parquet`` would: its file listing asks
    # for a whole CPU). One task reads a slice of an input shard and yields validated batches;
    # slices of a few batches give the actor pool enough blocks to keep every actor busy.
    step = cfg.index.batch_items * 2
    slices = [{"file": f, "start": a, "stop": min(a + step, expected[k])}
              for f, k in zip(files, pending) for a in range(0, expected[k], step)]
    ds = ray.data.from_items(slices, override_num_blocks=len(slices))
    ds = ds.map_batches(read_and_validate, fn_kwargs={"media_root": str(media_root),
                                                      "batch_items": cfg.index.batch_items},
                        batch_size=1, batch_format="numpy", num_cpus=0)
    ds = ds.map_batches(
        NodeEmbedder, fn_constructor_kwargs={"models_cfg": cfg.models, "hierarchy_cfg": cfg.hierarchy,
                                             "threads": max(1, int(cfg.index.cpus_per_actor))},
        compute=ray.data.ActorPoolStrategy(size=cfg.index.actors), batch_size=cfg.index.batch_items,
        batch_format="numpy", num_cpus=cfg.index.cpus_per_actor, num_gpus=cfg.index.num_gpus)
    held: dict[int, list] = defaultdict(list)
    seen: Counter = Counter()
    written, rows_done = 0, 0
    t0 = time.perf_counter()
    for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        shards = batch.column("shard").to_numpy()
        for k in np.unique(shards):
            k = int(k)
            part = batch.filter(pa.compute.equal(batch.column("shard"), k))
            held[k].append(part)
            seen[k] += part.num_rows
            if seen[k] > expected[k]:
                raise IndexJobError(f"input shard {k}: {seen[k]} rows, expected {expected[k]}")
            if seen[k] == expected[k]:
                _write_part(held.pop(k), work / PARTS / f"part-{k:05d}.parquet")
                written += 1
                rows_done += seen[k]
                elapsed = time.perf_counter() - t0
                log.info("input shard %d done (%d/%d this run; %.1f items/s)", k, written, len(pending),
                         rows_done / max(elapsed, 1e-9))
                if crash_after_parts is not None and written >= crash_after_parts:
                    raise SimulatedCrash(f"simulated kill after {written} finished shards")
    missing = [k for k in pending if not (work / PARTS / f"part-{k:05d}.parquet").exists()]
    if missing:
        raise IndexJobError(f"input shards {missing} did not complete")
    return rows_done


def _build(cfg: CanopyConfig, plan: dict, out: Path) -> dict:
    """Parts -> report, item table, FAISS shards, node store, manifest."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from canopy_ray.index.node_store import NodeStoreWriter
    from canopy_ray.index.reader import FORMAT, ITEMS, MANIFEST, index_checksum
    from canopy_ray.index.shards import ShardedIndex, shard_bounds

    parts = [out / WORK / PARTS / f"part-{k:05d}.parquet" for k in range(len(plan["shard_rows"]))]
    # Pass 1: which rows are kept (valid, first occurrence of their id), skipped rows, totals.
    seen_ids: set[str] = set()
    keep: list[np.ndarray] = []
    skipped: list[dict] = []
    n_items = n_nodes = 0
    for path in parts:
        t = pq.read_table(path, columns=["file", "line", "id", "reason", "message", "n_nodes"]).to_pydict()
        mask = np.zeros(len(t["id"]), bool)
        for j, (file, line, iid, reason, msg, nn) in enumerate(zip(t["file"], t["line"], t["id"], t["reason"],
                                                                   t["message"], t["n_nodes"])):
            if reason:
                skipped.append({"file": file, "line": line, "id": iid, "reason": reason, "message": msg})
            elif iid in seen_ids:
                skipped.append({"file": file, "line": line, "id": iid, "reason": "duplicate_id",
                                "message": f"item {iid!r}: id already indexed from an earlier line"})
            else:
                seen_ids.add(iid)
                mask[j] = True
                n_items += 1
                n_nodes += nn
        keep.append(mask)
    # Pass 2: stream the kept rows into the shards, the item table and the node store.
    dim = None
    for path, mask in zip(parts, keep):
        if mask.any():
            first = pq.read_table(path, columns=["item_vec"]).column("item_vec")[int(np.argmax(mask))].as_py()
            dim = len(first) // 4
            break
    if dim is None:
        raise IndexJobError("no valid item in the corpus; see report.json")
    index = ShardedIndex.empty(dim, shard_bounds(n_items, cfg.retrieval.shards), cfg.retrieval.index_type)
    nodes = NodeStoreWriter(out, n_nodes, dim)
    items_tmp = out / (ITEMS + ".tmp")
    writer = pq.ParquetWriter(items_tmp, pa.schema([("id", pa.string()), ("modality", pa.string()),
                                                    ("item", pa.string())]))
    at = 0
    for path, mask in zip(parts, keep):
        if not mask.any():
            continue
        t = pq.read_table(path).filter(pa.array(mask))
        d = t.select(["id", "modality", "item", "spans", "node_vecs", "item_vec"]).to_pydict()
        vecs = np.stack([np.frombuffer(b, np.float32) for b in d["item_vec"]])
        index.add(vecs, at)
        at += len(vecs)
        for iid, sb, nb in zip(d["id"], d["spans"], d["node_vecs"]):
            nodes.add(iid, np.frombuffer(sb, np.int32).reshape(-1, 2),
                      np.frombuffer(nb, np.float16).reshape(-1, dim))
        writer.write_table(t.select(["id", "modality", "item"]))
    writer.close()
    items_tmp.replace(out / ITEMS)
    node_entry = nodes.close()
    entries = index.save(out)
    counts = Counter(s["reason"] for s in skipped)
    report = {"skipped": len(skipped), "by_reason": dict(sorted(counts.items())), "list": "skipped.jsonl"}
    (out / "skipped.jsonl").write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in skipped))
    (out / "report.json").write_text(json.dumps(report, indent=1))
    settings = plan["settings"]
    manifest = {
        "format": FORMAT, "model_id": _model_id(cfg), "encoder": cfg.models.encoder, "dim": dim,
        "count": n_items, "nodes": n_nodes, "adapter_id": settings["models"]["adapter_id"],
        "index_type": cfg.retrieval.index_type, "metric": "inner_product", "shards": entries,
        "node_store": node_entry, "items": ITEMS, "hierarchy": settings["hierarchy"],
        "corpus_fingerprint": plan["fingerprint"],
        "checksum": index_checksum(entries, [out / ITEMS, out / node_entry["vectors"]]),
    }
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.replace(out / MANIFEST)
    return {"items": n_items, "nodes": n_nodes, "skipped": len(skipped), "skipped_by_reason": report["by_reason"],
            "duplicates": counts.get("duplicate_id", 0), "index_shards": len(entries), "dim": dim}


def _model_id(cfg: CanopyConfig) -> str:
    if cfg.models.encoder_path:
        return Path(cfg.models.encoder_path).name
    return {"minilm": "all-MiniLM-L6-v2", "qwen3-vl": "Qwen3-VL-Embedding-2B"}[cfg.models.encoder]


def run_index(cfg: CanopyConfig, corpus_path: str | Path, out_dir: str | Path, *,
              media_root: str | Path | None = None, overwrite: bool = False, progress: bool = True,
              ray_address: str | None = None, num_cpus: int | None = None,
              crash_after_parts: int | None = None) -> dict:
    """Index ``corpus_path`` into ``out_dir`` (resuming an interrupted run); return the summary.

    ``media_root`` resolves relative image/video paths (default: the corpus's directory).
    Ray is started locally (``num_cpus``) unless already initialised or ``ray_address`` /
    ``RAY_ADDRESS`` names a cluster. ``crash_after_parts`` is a test hook that stops the run
    as a kill would, after that many input shards were written.
    """
    t_start = time.perf_counter()
    corpus, out = Path(corpus_path), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    media_root = Path(media_root) if media_root else (corpus if corpus.is_dir() else corpus.parent)
    media_root = media_root.resolve()
    plan = _plan(cfg, corpus, out, media_root, overwrite)
    n_shards = len(plan["shard_rows"])
    if not sum(plan["shard_rows"]):
        raise IndexJobError(f"corpus {corpus} has no non-blank lines")
    (out / WORK / PARTS).mkdir(exist_ok=True)
    pending = [k for k in range(n_shards) if not (out / WORK / PARTS / f"part-{k:05d}.parquet").exists()]
    log.info("%d input shards, %d already done, %d to compute", n_shards, n_shards - len(pending), len(pending))
    rows_done = nodes_done = 0
    t_embed = time.perf_counter()
    if pending:
        import ray

        started = False
        if not ray.is_initialized():
            # "local" starts a private instance even when another `ray start` cluster runs here.
            address = ray_address or os.environ.get("RAY_ADDRESS") or "local"
            local = address == "local"
            ray.init(address=address, num_cpus=num_cpus if local else None,
                     include_dashboard=False if local else None)
            started = True
        try:
            rows_done = _embed_pending(cfg, plan, out, media_root, pending, progress,
                                                   crash_after_parts)
        finally:
            if started:
                ray.shutdown()
    embed_s = time.perf_counter() - t_embed
    built = _build(cfg, plan, out)
    if pending:  # nodes of the items embedded in this run, from the parts just written
        import pyarrow.parquet as pq

        nodes_done = sum(int(np.sum(pq.read_table(out / WORK / PARTS / f"part-{k:05d}.parquet",
                                                  columns=["n_nodes"]).column("n_nodes").to_numpy()))
                         for k in pending)
    summary = built | {
        "input_lines": int(sum(plan["shard_rows"])), "input_shards": n_shards,
        "shards_resumed": n_shards - len(pending), "shards_computed": len(pending),
        "rows_computed": rows_done, "nodes_computed": nodes_done,
        "embed_seconds": round(embed_s, 3), "seconds": round(time.perf_counter() - t_start, 3),
        "items_per_s": round(rows_done / embed_s, 2) if rows_done else 0.0,
        "nodes_per_s": round(nodes_done / embed_s, 2) if nodes_done else 0.0,
        "out_dir": str(out),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def format_summary(s: dict) -> str:
    reasons = ", ".join(f"{k} {v}" for k, v in s["skipped_by_reason"].items()) or "none"
    return (f"indexed {s['items']} items ({s['nodes']} nodes, dim {s['dim']}, {s['index_shards']} FAISS shards) "
            f"into {s['out_dir']}\n"
            f"skipped {s['skipped']} of {s['input_lines']} lines ({reasons}); see report.json, skipped.jsonl\n"
            f"input shards: {s['shards_computed']} computed, {s['shards_resumed']} resumed; "
            f"{s['items_per_s']} items/s, {s['nodes_per_s']} nodes/s over {s['embed_seconds']} s of embedding")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="canopy index", description="Index a corpus: FAISS shards + cached node embeddings (Ray Data job).")
    p.add_argument("--config", default=None, help="YAML config (default: built-in defaults)")
    p.add_argument("--corpus", required=True, help="corpus JSONL / JSONL.gz / parquet, or a directory of them")
    p.add_argument("--out", required=True, help="output directory (index, report, resumable state)")
    p.add_argument("--media-root", default=None, help="base of relative media paths (default: the corpus's dir)")
    p.add_argument("--overwrite", action="store_true", help="discard state from another corpus or settings")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray instance, if one is started")
    p.add_argument("--actors", type=int, default=None, help="override index.actors")
    p.add_argument("--shard-items", type=int, default=None, help="override index.shard_items")
    p.add_argument("--no-progress", action="store_true", help="no Ray Data progress bars")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    overrides = {k: v for k, v in {"actors": args.actors, "shard_items": args.shard_items}.items() if v}
    try:
        cfg = load_config(args.config, **({"index": overrides} if overrides else {}))
        summary = run_index(cfg, args.corpus, args.out, media_root=args.media_root, overwrite=args.overwrite,
                            progress=not args.no_progress, num_cpus=args.num_cpus)
    except (ConfigError, IndexJobError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    print(json.dumps(summary))
    return 0
