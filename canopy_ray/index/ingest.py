"""The per-item work of the indexing job, independent of Ray: split, validate, embed.

``split_corpus`` cuts the corpus (JSONL, JSONL.gz or parquet; a file or a directory of them)
into numbered input shards of ``shard_items`` non-blank lines, each named by a hash of its
lines: the unit of resume, and of reuse when the corpus grows.
``validate_batch`` parses each raw line into a canonical item (bad JSON, empty text, ragged
tables...) and checks that its media can be read (video with decord, images with PIL);
a bad row keeps its ``reason`` and travels on, so every input line is accounted for.
``NodeEmbedder`` builds each item's hierarchy and embeds all its nodes with f_theta and the
item with f0; the Ray Data actors (``SliceEmbedder``: read, validate and embed a slice of an
input shard) and the plain benchmark loop call the same code.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Iterator

import numpy as np

from canopy_ray.core.errors import ItemError
from canopy_ray.core.files import atomic_path
from canopy_ray.core.evidence import piece
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import ImageItem, VideoItem, item_to_dict, parse_item

CORPUS_SUFFIXES = (".jsonl", ".jsonl.gz", ".json.gz", ".parquet")
ROW_COLUMNS = ("shard", "row", "file", "line", "id", "modality", "reason", "message", "item")


def corpus_files(path: str | Path) -> list[Path]:
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.name.endswith(CORPUS_SUFFIXES))
        if not files:
            raise FileNotFoundError(f"{path} holds no corpus files ({', '.join(CORPUS_SUFFIXES)})")
        return files
    if not path.exists():
        raise FileNotFoundError(f"corpus {path} not found")
    return [path]


def iter_raw(files: list[Path]) -> Iterator[tuple[str, int, str]]:
    """``(file name, 1-based line or row, raw JSON text)`` of each non-blank line, in order."""
    for f in files:
        if f.name.endswith(".parquet"):
            import pyarrow.parquet as pq

            n = 0
            for batch in pq.ParquetFile(f).iter_batches(batch_size=4096):
                for row in batch.to_pylist():
                    n += 1
                    yield f.name, n, json.dumps(row, default=str)
            continue
        opener = gzip.open if f.name.endswith(".gz") else open
        with opener(f, "rt", encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    yield f.name, n, line.rstrip("\n")


def split_corpus(files: list[Path], inputs_dir: Path, shard_items: int) -> tuple[list[int], list[str]]:
    """Write ``inputs_dir/shard-NNNNN.parquet`` (shard, row, file, line, raw); return rows per
    shard and each shard's key, a hash of its rows' file names, line numbers and text.

    ``row`` numbers the non-blank lines of the whole corpus (the order within a shard; a part
    kept from an earlier split keeps that split's numbers, and parts are read in plan order, so
    duplicates still resolve to the first line); ``file`` and ``line`` say where a skipped item is."""
    import hashlib

    import pyarrow as pa
    import pyarrow.parquet as pq

    inputs_dir.mkdir(parents=True, exist_ok=True)
    counts: list[int] = []
    keys: list[str] = []
    buf: list[tuple[str, int, str]] = []

    def flush():
        k = len(counts)
        start = k * shard_items
        table = pa.table({"shard": pa.array([k] * len(buf), pa.int32()),
                          "row": pa.array(range(start, start + len(buf)), pa.int64()),
                          "file": pa.array([b[0] for b in buf], pa.string()),
                          "line": pa.array([b[1] for b in buf], pa.int64()),
                          "raw": pa.array([b[2] for b in buf], pa.string())})
        path = inputs_dir / f"shard-{k:05d}.parquet"
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp)
        h = hashlib.sha256()
        for name, line, raw in buf:
            h.update(f"{name}\0{line}\0{raw}\n".encode())
        counts.append(len(buf))
        keys.append(h.hexdigest()[:32])
        buf.clear()

    for raw in iter_raw(files):
        buf.append(raw)
        if len(buf) == shard_items:
            flush()
    if buf or not counts:
        flush()
    return counts, keys


def check_media(item, media_root: Path | None) -> dict:
    """The canonical item JSON with its media path made absolute; raises ItemError when the
    media cannot be read."""
    obj = item_to_dict(item)
    if not isinstance(item, (ImageItem, VideoItem)):
        return obj
    path = Path(item.path)
    if not path.is_absolute() and media_root is not None:
        path = media_root / path
    if not path.is_file():
        raise ItemError("missing_media", f"media file {item.path!r} not found", item.id)
    if isinstance(item, VideoItem):
        from canopy_ray.models.media import import_decord

        decord = import_decord()  # not an ItemError: without decord the job stops and names the extra
        try:
            vr = decord.VideoReader(str(path), ctx=decord.cpu(0))
            if len(vr) == 0:
                raise ValueError("no frames")
            vr[0]
        except Exception as e:  # decord raises its own error types
            raise ItemError("unreadable_video", f"decord cannot read {item.path!r}: {str(e)[:200]}",
                            item.id) from None
    else:
        try:
            from PIL import Image

            with Image.open(path) as im:
                im.verify()
        except Exception as e:
            raise ItemError("unreadable_image", f"cannot read image {item.path!r}: {str(e)[:200]}",
                            item.id) from None
    obj["path"] = str(path.resolve())
    return obj


def validate_row(raw: str, media_root: Path | None) -> tuple[str, str, str, str, str]:
    """(id, modality, reason, message, canonical item JSON); reason is '' for a good item."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        return "", "", "bad_json", f"invalid JSON ({e.msg})", ""
    raw_id = obj.get("id") if isinstance(obj, dict) else None
    try:
        item = parse_item(obj)
        canon = check_media(item, media_root)
    except ItemError as e:
        return (str(raw_id) if raw_id is not None else "", str(obj.get("modality", "")) if isinstance(obj, dict)
                else "", e.reason, str(e), "")
    return item.id, item.modality, "", "", json.dumps(canon, ensure_ascii=False)


def read_and_validate(batch: dict, media_root: str | None = None, batch_items: int = 32) -> Iterator[dict]:
    """Ray Data stage: slices ``(file, start, stop)`` of input shards -> batches of validated rows."""
    import pyarrow.parquet as pq

    for path, a, b in zip(batch["file"], batch["start"], batch["stop"]):
        table = pq.read_table(str(path)).slice(int(a), int(b) - int(a))
        for start in range(0, table.num_rows, batch_items):
            chunk = table.slice(start, batch_items)
            yield validate_batch({c: chunk.column(c).to_numpy(zero_copy_only=False)
                                  for c in ("shard", "row", "file", "line", "raw")}, media_root)


def validate_batch(batch: dict, media_root: str | None = None) -> dict:
    """Ray Data stage: raw lines -> canonical items or reasons (numpy batch format)."""
    root = Path(media_root) if media_root else None
    rows = [validate_row(r, root) for r in batch["raw"]]
    out = {"shard": np.asarray(batch["shard"], np.int32), "row": np.asarray(batch["row"], np.int64),
           "file": np.asarray(batch["file"], dtype=object), "line": np.asarray(batch["line"], np.int64)}
    for i, name in enumerate(("id", "modality", "reason", "message", "item")):
        out[name] = np.array([r[i] for r in rows], dtype=object)
    return out


class NodeEmbedder:
    """Builds hierarchies and embeds nodes (f_theta) and items (f0) for a batch of rows.

    Used as the Ray Data callable class; ``threads`` sets torch's intra-op threads (an actor
    holding one CPU uses one thread).
    """

    def __init__(self, models_cfg, hierarchy_cfg, device: str | None = None, threads: int | None = None,
                 encoder=None):
        import torch

        from canopy_ray.models.encoder import build_encoder

        if threads:
            torch.set_num_threads(int(threads))
        if device is None:
            device = models_cfg.device
            if device.startswith("cuda") and not torch.cuda.is_available():
                device = "cpu"
        self.encoder = encoder or build_encoder(models_cfg, device=device)
        self.h = hierarchy_cfg

    def _trees(self, items_json):
        trees = []
        for js in items_json:
            item = parse_item(json.loads(js))
            trees.append(build_tree(item, self.h.branching, self.h.segment_s, self.h.frame_every_s,
                                    self.h.max_frames))
        return trees

    def embed(self, items_json: list[str]) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
        """Per item: spans (n, 2) int32, node vectors (n, dim) float32; and item vectors."""
        trees = self._trees(items_json)
        spans = [np.array([n.span for n in t.nodes()], np.int32).reshape(-1, 2) for t in trees]
        pieces = [piece(t, [tuple(s)]) for t, sp in zip(trees, spans) for s in sp]
        vecs = self.encoder.encode_nodes(pieces) if pieces else np.zeros((0, self.encoder.dim), np.float32)
        node_vecs, at = [], 0
        for sp in spans:
            node_vecs.append(vecs[at:at + len(sp)])
            at += len(sp)
        if getattr(self.encoder, "adapter_id", "frozen") == "frozen":
            item_vecs = np.stack([v[0] for v in node_vecs]) if node_vecs else np.zeros((0, self.encoder.dim))
        else:  # f0 of the whole item (the root piece) for retrieval
            item_vecs = self.encoder.encode_items([piece(t, [t.root.span]) for t in trees])
        return spans, node_vecs, np.asarray(item_vecs, np.float32)

    def __call__(self, batch: dict) -> dict:
        reasons = list(batch["reason"])
        messages = list(batch["message"])
        good = [i for i, r in enumerate(reasons) if not r]
        n = len(reasons)
        spans_b, nodes_b, item_b = [b""] * n, [b""] * n, [b""] * n
        n_nodes = np.zeros(n, np.int32)
        results = {}
        try:
            sp, nv, iv = self.embed([batch["item"][i] for i in good])
            results = {i: (sp[j], nv[j], iv[j]) for j, i in enumerate(good)}
        except Exception:  # find the item that fails, keep the rest
            for i in good:
                try:
                    sp, nv, iv = self.embed([batch["item"][i]])
                    results[i] = (sp[0], nv[0], iv[0])
                except Exception as e:
                    reasons[i], messages[i] = "encode_error", f"{type(e).__name__}: {str(e)[:200]}"
        for i, (sp, nv, iv) in results.items():
            spans_b[i] = sp.astype(np.int32).tobytes()
            nodes_b[i] = nv.astype(np.float16).tobytes()
            item_b[i] = iv.astype(np.float32).tobytes()
            n_nodes[i] = len(sp)
        out = {k: batch[k] for k in ROW_COLUMNS}
        out["reason"] = np.array(reasons, dtype=object)
        out["message"] = np.array(messages, dtype=object)
        out["n_nodes"] = n_nodes
        out["spans"] = np.array(spans_b, dtype=object)
        out["node_vecs"] = np.array(nodes_b, dtype=object)
        out["item_vec"] = np.array(item_b, dtype=object)
        return out


class SliceEmbedder(NodeEmbedder):
    """The index job's Ray Data callable class: slices ``(file, start, stop)`` of input shards
    -> read, validated (:func:`read_and_validate`) and embedded rows, one batch of at most
    ``batch_items`` rows at a time.

    Reading and validating in the embedding actor itself needs no validation tasks beside it:
    on a small machine their worker processes (each importing Ray Data, pyarrow and the
    project) took the CPUs the actors need while they load their models.
    """

    def __init__(self, models_cfg, hierarchy_cfg, media_root: str | None = None, batch_items: int = 32,
                 device: str | None = None, threads: int | None = None, encoder=None):
        super().__init__(models_cfg, hierarchy_cfg, device=device, threads=threads, encoder=encoder)
        self.media_root, self.batch_items = media_root, batch_items

    def __call__(self, batch: dict) -> Iterator[dict]:
        for rows in read_and_validate(batch, self.media_root, self.batch_items):
            yield super().__call__(rows)
