"""The index job: corpus -> FAISS shards + cached node embeddings, with Ray Data.

Steps (everything under ``OUT/work`` is resumable state):

1. **Plan.** The corpus is cut into input shards of ``index.shard_items`` lines
   (``work/inputs/shard-NNNNN.parquet``), each keyed by a hash of its lines;
   ``work/plan.json`` records the corpus path and checksum, the keys and every setting the
   embeddings depend on. Rerunning with other settings or another corpus path is refused
   (``overwrite=True`` starts over); rerunning after the corpus at the same path changed updates
   the index: the shards whose lines did not change (all of them before the first changed line)
   keep their parts. Media files are not hashed: an image edited in place is not seen.
2. **Embed.** Ray Data hands slices of the pending input shards to a callable-class actor
   pool (``ActorPoolStrategy(size=index.actors)``, each actor ``index.cpus_per_actor`` CPUs
   and ``index.num_gpus`` GPUs) that reads, validates and embeds them. The driver collects the
   rows of each input shard and writes ``work/parts/part-<key>.parquet`` atomically once
   the shard is complete. Killed at any point, a rerun skips the shards whose part exists.
   An actor that dies (SIGKILL, OOM) is restarted by Ray Data and its slice retried (its
   actor pools default to ``max_restarts=-1``, ``max_task_retries=-1``), so the run goes on.
3. **Build.** From the parts in shard order: bad rows and duplicate ids (the first line
   wins) go to ``report.json`` / ``skipped.jsonl``; the rest fill the FAISS shards, the item
   table and the node store (an ``ivf`` index measures its recall@10 on a sample of its own
   vectors and records the ``nprobe`` that reaches ``retrieval.recall_target``); the manifest is
   written last (:mod:`canopy_ray.index.manifest`); ``summary.json`` says what the run did. Every run
   builds again from the parts, so rerunning the job repairs a damaged index in seconds.
   Parts of shards no longer in the corpus are removed after the build.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from canopy_ray.config import CanopyConfig
from canopy_ray.core.files import atomic_path, sha256_files, write_json, write_jsonl
import canopy_ray.index.manifest as manifest
from canopy_ray.index.ingest import SliceEmbedder, corpus_files, split_corpus
from canopy_ray.index.shards import RecallProbe, auto_nlist, sample_rows, train_size
from canopy_ray.index.writer import IndexWriter
from canopy_ray.models.adapters import model_id

log = logging.getLogger("canopy_ray.index.job")

WORK, INPUTS, PARTS, PLAN = "work", "inputs", "parts", "plan.json"
PART_COLUMNS = ("shard", "row", "file", "line", "id", "modality", "reason", "message", "item", "n_nodes", "spans",
                "node_vecs", "item_vec")


class IndexJobError(RuntimeError):
    pass


def _settings(cfg: CanopyConfig, media_root: Path) -> dict:
    """Everything the per-item rows depend on; a change invalidates finished shards."""
    from canopy_ray.core.evidence import NODE_TEXT_VERSION
    from canopy_ray.models.adapters import adapter_id

    return {"models": {"encoder": cfg.models.encoder, "encoder_path": cfg.models.encoder_path,
                       "adapter_id": adapter_id(cfg.models.adapter), "max_length": cfg.models.max_length},
            "hierarchy": cfg.hierarchy.model_dump(), "node_text": NODE_TEXT_VERSION,
            "shard_items": cfg.index.shard_items,
            "media_root": str(media_root)}


def _parts(out: Path, plan: dict) -> list[Path]:
    """Each input shard's part, in plan order: named by the shard's key, so an update finds it."""
    return [out / WORK / PARTS / f"part-{key}.parquet" for key in plan["shard_keys"]]


def _plan(cfg: CanopyConfig, corpus: Path, out: Path, media_root: Path, overwrite: bool) -> dict:
    """The run's plan: the earlier one when nothing changed; an update when only the corpus at the
    same path changed (parts of unchanged shards stay); else a fresh start, which discards the
    earlier state only with ``overwrite``."""
    work = out / WORK
    files = corpus_files(corpus)
    plan_path = work / PLAN
    want = {"source": str(corpus.resolve()), "corpus": [str(f.resolve()) for f in files],
            "fingerprint": sha256_files(files, with_names=True), "settings": _settings(cfg, media_root)}
    plan = _read_plan(plan_path)
    same = plan is not None and all(plan.get(k) == want[k] for k in ("source", "settings"))
    if same and plan.get("fingerprint") == want["fingerprint"]:
        return plan
    if same:  # the corpus changed: unchanged shards keep their parts, the rest is planned anew
        # until the new plan is written, no run may pair the old plan with the new inputs
        write_json(plan_path, plan | {"fingerprint": None})
        shutil.rmtree(work / INPUTS, ignore_errors=True)
        log.info("the corpus changed: updating the index (input shards with unchanged lines are kept)")
    else:
        if plan is not None and not overwrite:
            raise IndexJobError(
                f"{out} holds an unfinished or finished index of another corpus path or other settings "
                f"(see {plan_path}); use a new output directory or overwrite=True (--overwrite)")
        if work.exists():
            shutil.rmtree(work)
        manifest.clear(out)
        work.mkdir(parents=True)
    rows, keys = split_corpus(files, work / INPUTS, cfg.index.shard_items)
    plan = want | {"shard_rows": rows, "shard_keys": keys}
    write_json(plan_path, plan)
    return plan


def _read_plan(path: Path) -> dict | None:
    """The plan of an earlier run, or None. It is written atomically; one that does not parse
    was damaged on disk, so its parts cannot be trusted either: start over."""
    if not path.exists():
        return None
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(plan, dict) and all(isinstance(plan.get(k), list) for k in ("shard_rows", "shard_keys")):
            return plan
    except (UnicodeDecodeError, json.JSONDecodeError):
        pass
    log.warning("%s is damaged or from an earlier version: starting the index job over", path)
    return None


def _write_part(rows: list, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = [pa.Table.from_batches([b]) if isinstance(b, pa.RecordBatch) else b for b in rows]
    table = pa.concat_tables([t.select(list(PART_COLUMNS)) for t in tables]).sort_by("row")
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def _dataset(cfg: CanopyConfig, out: Path, media_root: Path, pending: list[int], expected: dict[int, int]):
    """The Ray Data pipeline over the pending input shards: slices of ``index.batch_items`` rows,
    each read, validated and embedded by one call of an actor of the pool (``SliceEmbedder``)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import ray

    # No separate validation stage: its tasks' worker processes (each importing Ray Data,
    # pyarrow and the project) took the CPUs the actors need while they load their models, and
    # reading a slice is light next to embedding it. An actor takes one slice at a time, and
    # within a shard the slices go out largest first (raw JSON bytes), so the actors finish
    # together instead of one of them working through the last, largest slices alone.
    n = cfg.index.batch_items
    slices = []
    for k in pending:
        path = out / WORK / INPUTS / f"shard-{k:05d}.parquet"
        size = pc.binary_length(pq.read_table(path, columns=["raw"]).column("raw")).to_numpy()
        starts = sorted(range(0, expected[k], n), key=lambda a: -int(size[a:a + n].sum()))
        slices += [{"file": str(path), "start": a, "stop": min(a + n, expected[k])} for a in starts]
    ds = ray.data.from_items(slices, override_num_blocks=len(slices))
    return ds.map_batches(
        SliceEmbedder, fn_constructor_kwargs={"models_cfg": cfg.models, "hierarchy_cfg": cfg.hierarchy,
                                              "media_root": str(media_root), "batch_items": n,
                                              "threads": max(1, int(cfg.index.cpus_per_actor))},
        compute=ray.data.ActorPoolStrategy(size=cfg.index.actors, max_tasks_in_flight_per_actor=1),
        batch_size=1, batch_format="numpy", num_cpus=cfg.index.cpus_per_actor, num_gpus=cfg.index.num_gpus)


def _embed_pending(cfg: CanopyConfig, plan: dict, out: Path, parts: list[Path], media_root: Path,
                   pending: list[int], progress: bool) -> int:
    """Run the pipeline and write each input shard's part once all its rows are back; return
    the rows computed."""
    import pyarrow as pa
    import ray

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = progress
    ctx.execution_options.preserve_order = False
    expected = {k: plan["shard_rows"][k] for k in pending}
    held: dict[int, list] = defaultdict(list)
    seen: Counter = Counter()
    written, rows_done = 0, 0
    t0 = time.perf_counter()
    for batch in _dataset(cfg, out, media_root, pending, expected).iter_batches(batch_size=None,
                                                                               batch_format="pyarrow"):
        for k in np.unique(batch.column("shard").to_numpy()):
            k = int(k)
            part = batch.filter(pa.compute.equal(batch.column("shard"), k))
            held[k].append(part)
            seen[k] += part.num_rows
            if seen[k] > expected[k]:
                raise IndexJobError(f"input shard {k}: {seen[k]} rows, expected {expected[k]}")
            if seen[k] < expected[k]:
                continue
            _write_part(held.pop(k), parts[k])
            written += 1
            rows_done += seen[k]
            log.info("input shard %d done (%d/%d this run; %.1f items/s)", k, written, len(pending),
                     rows_done / max(time.perf_counter() - t0, 1e-9))
    missing = [k for k in pending if not parts[k].exists()]
    if missing:
        raise IndexJobError(f"input shards {missing} did not complete")
    return rows_done


@dataclass
class _Selection:
    """Which rows of each part are indexed (valid, first occurrence of their id)."""

    keep: list[np.ndarray]
    skipped: list[dict]
    items: int = 0
    nodes: int = 0


def _select(parts: list[Path]) -> _Selection:
    import pyarrow.parquet as pq

    sel = _Selection([], [])
    seen_ids: set[str] = set()
    for path in parts:
        t = pq.read_table(path, columns=["file", "line", "id", "reason", "message", "n_nodes"]).to_pydict()
        mask = np.zeros(len(t["id"]), bool)
        for j, (file, line, iid, reason, msg, nn) in enumerate(zip(t["file"], t["line"], t["id"], t["reason"],
                                                                   t["message"], t["n_nodes"])):
            if reason:
                sel.skipped.append({"file": file, "line": line, "id": iid, "reason": reason, "message": msg})
            elif iid in seen_ids:
                sel.skipped.append({"file": file, "line": line, "id": iid, "reason": "duplicate_id",
                                    "message": f"item {iid!r}: id already indexed from an earlier line"})
            else:
                seen_ids.add(iid)
                mask[j] = True
                sel.items += 1
                sel.nodes += nn
        sel.keep.append(mask)
    return sel


def _dim(parts: list[Path], keep: list[np.ndarray]) -> int:
    import pyarrow.parquet as pq

    for path, mask in zip(parts, keep):
        if mask.any():
            first = pq.read_table(path, columns=["item_vec"]).column("item_vec")[int(np.argmax(mask))].as_py()
            return len(first) // 4  # float32 bytes
    raise IndexJobError("no valid item in the corpus; see report.json")


def _fill(cfg: CanopyConfig, out: Path, parts: list[Path], sel: _Selection, dim: int) -> IndexWriter:
    """Stream the kept rows into the index writer: FAISS shards, item table, node store."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    r = cfg.retrieval
    sample = probe = None
    if r.index_type == "ivf":  # both samples read in one pass over the parts
        train = sample_rows(sel.items, train_size(r.nlist or auto_nlist(sel.items), sel.items))
        queries = RecallProbe.rows_for(sel.items)
        rows = np.union1d(train, queries)
        vecs = _vectors_at(parts, sel, rows)
        sample = vecs[np.searchsorted(rows, train)]
        probe = RecallProbe(queries, vecs[np.searchsorted(rows, queries)], r.recall_target)
    writer = IndexWriter(out, count=sel.items, dim=dim, nodes=sel.nodes, index_type=r.index_type,
                         shards=r.shards, sample=sample, nlist=r.nlist, recall=probe)
    for path, mask in zip(parts, sel.keep):
        if not mask.any():
            continue
        t = pq.read_table(path).filter(pa.array(mask))
        vecs = np.frombuffer(b"".join(t.column("item_vec").to_pylist()), np.float32).reshape(-1, dim)
        counts = t.column("n_nodes").to_numpy()
        spans = np.frombuffer(b"".join(t.column("spans").to_pylist()), np.int32).reshape(-1, 2)
        nodes = np.frombuffer(b"".join(t.column("node_vecs").to_pylist()), np.float16).reshape(-1, dim)
        writer.add(t.column("id"), t.column("modality"), t.column("item"), vecs, counts, spans, nodes)
    return writer


def _vectors_at(parts: list[Path], sel: _Selection, rows: np.ndarray) -> np.ndarray:
    """The item vectors of the kept rows ``rows`` (sorted positions in the index)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out, at = [], 0
    for path, mask in zip(parts, sel.keep):
        n = int(mask.sum())
        mine = rows[(rows >= at) & (rows < at + n)] - at
        if len(mine):
            col = pq.read_table(path, columns=["item_vec"]).filter(pa.array(mask)).column("item_vec")
            out += [np.frombuffer(col[int(j)].as_py(), np.float32) for j in mine]
        at += n
    return np.stack(out)


def _build(cfg: CanopyConfig, plan: dict, out: Path, parts: list[Path]) -> dict:
    """Parts -> report, item table, FAISS shards, node store, manifest."""
    sel = _select(parts)
    counts = Counter(s["reason"] for s in sel.skipped)
    write_jsonl(out / "skipped.jsonl", sel.skipped)
    write_json(out / "report.json", {"skipped": len(sel.skipped), "by_reason": dict(sorted(counts.items())),
                                     "list": "skipped.jsonl"})
    dim = _dim(parts, sel.keep)
    settings = plan["settings"]
    written = _fill(cfg, out, parts, sel, dim).close(
        model_id=model_id(cfg), encoder=cfg.models.encoder, adapter_id=settings["models"]["adapter_id"],
        hierarchy=settings["hierarchy"], corpus_fingerprint=plan["fingerprint"])
    entries = written["shards"]
    measured = {"ivf_recall": written[manifest.IVF_RECALL]} if manifest.IVF_RECALL in written else {}
    return {"items": sel.items, "nodes": sel.nodes, "skipped": len(sel.skipped),
            "skipped_by_reason": dict(sorted(counts.items())), "duplicates": counts.get("duplicate_id", 0),
            "index_shards": len(entries), "dim": dim, **measured}


def _in_ray(ray_address: str | None, num_cpus: int | None, fn):
    """``fn()`` inside Ray: the running one, else one started here (``local`` by default, a
    private instance even when a ``ray start`` cluster runs here) and stopped afterwards."""
    import ray

    if ray.is_initialized():
        return fn()
    address = ray_address or os.environ.get("RAY_ADDRESS") or "local"
    local = address == "local"
    ray.init(address=address, num_cpus=num_cpus if local else None, include_dashboard=False if local else None)
    try:
        return fn()
    finally:
        ray.shutdown()


def run_index(cfg: CanopyConfig, corpus_path: str | Path, out_dir: str | Path, *,
              media_root: str | Path | None = None, overwrite: bool = False, progress: bool = True,
              ray_address: str | None = None, num_cpus: int | None = None) -> dict:
    """Index ``corpus_path`` into ``out_dir`` (resuming an interrupted run); return the summary.

    ``media_root`` resolves relative image/video paths (default: the corpus's directory).
    Ray is started locally (``num_cpus``) unless already initialised or ``ray_address`` /
    ``RAY_ADDRESS`` names a cluster. Killed at any point (``tests/jobs/test_kill.py`` sends
    real SIGKILLs), the same call again gives the same index. The config and corpus paths are
    kept beside the index (:func:`manifest.write_job_files`), so that a load error can name
    the command that rebuilds it.
    """
    t_start = time.perf_counter()
    corpus, out = Path(corpus_path), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    media_root = Path(media_root) if media_root else (corpus if corpus.is_dir() else corpus.parent)
    media_root = media_root.resolve()
    plan = _plan(cfg, corpus, out, media_root, overwrite)
    manifest.write_job_files(out, cfg.model_dump(mode="json"), corpus, media_root)
    n_shards = len(plan["shard_rows"])
    if not sum(plan["shard_rows"]):
        raise IndexJobError(f"corpus {corpus} has no non-blank lines")
    (out / WORK / PARTS).mkdir(exist_ok=True)
    parts = _parts(out, plan)
    pending = [k for k, path in enumerate(parts) if not path.exists()]
    log.info("%d input shards, %d already done, %d to compute", n_shards, n_shards - len(pending), len(pending))
    t_embed = time.perf_counter()
    rows_done = 0
    if pending:
        rows_done = _in_ray(ray_address, num_cpus, lambda: _embed_pending(
            cfg, plan, out, parts, media_root, pending, progress))
    embed_s = time.perf_counter() - t_embed
    built = _build(cfg, plan, out, parts)
    for path in set((out / WORK / PARTS).glob("part-*.parquet")) - set(parts):  # shards an update left behind
        path.unlink()
    summary = built | _throughput([parts[k] for k in pending], rows_done, embed_s) | {
        "input_lines": int(sum(plan["shard_rows"])), "input_shards": n_shards,
        "shards_resumed": n_shards - len(pending), "shards_computed": len(pending),
        "seconds": round(time.perf_counter() - t_start, 3), "out_dir": str(out)}
    write_json(out / "summary.json", summary)
    return summary


def _throughput(written: list[Path], rows_done: int, embed_s: float) -> dict:
    """Items and nodes embedded in this run (from the parts just written) per second."""
    import pyarrow.parquet as pq

    nodes_done = sum(int(np.sum(pq.read_table(path, columns=["n_nodes"]).column("n_nodes").to_numpy()))
                     for path in written)
    return {"rows_computed": rows_done, "nodes_computed": nodes_done, "embed_seconds": round(embed_s, 3),
            "items_per_s": round(rows_done / embed_s, 2) if rows_done else 0.0,
            "nodes_per_s": round(nodes_done / embed_s, 2) if nodes_done else 0.0}


def format_summary(s: dict) -> str:
    reasons = ", ".join(f"{k} {v}" for k, v in s["skipped_by_reason"].items()) or "none"
    return (f"indexed {s['items']} items ({s['nodes']} nodes, dim {s['dim']}, {s['index_shards']} FAISS shards) "
            f"into {s['out_dir']}\n"
            f"skipped {s['skipped']} of {s['input_lines']} lines ({reasons}); see report.json, skipped.jsonl\n"
            f"input shards: {s['shards_computed']} computed, {s['shards_resumed']} resumed; "
            f"{s['items_per_s']} items/s, {s['nodes_per_s']} nodes/s over {s['embed_seconds']} s of embedding"
            + _ivf_line(s.get("ivf_recall")))


def _ivf_line(m: dict | None) -> str:
    """What an ivf index measured (searches with ``retrieval.nprobe: auto`` use its nprobe)."""
    if not m:
        return ""
    return (f"\nivf: recall@10 {m['recall']} against exact search at nprobe {m['nprobe']}, the smallest reaching "
            f"{m['target']} on {m['queries']} of its own vectors (retrieval.nprobe: auto searches with it)")
