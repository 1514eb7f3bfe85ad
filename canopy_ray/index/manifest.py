"""The one owner of an index directory's on-disk format: file names and ``manifest.json``.

Layout written by :mod:`canopy_ray.index.job`::

    DIR/manifest.json         format, model id, dim, count, adapter id, index type, checksums
    DIR/shard-000.faiss ...   FAISS shards (rows in item-table order)
    DIR/items.parquet         the item table: id, modality, canonical item JSON
    DIR/nodes.f16.npy, node_spans.npy, node_items.parquet   the node store
    DIR/summary.json, report.json, skipped.jsonl             what the job did and skipped

``manifest.json`` is written last (atomically), so its presence means the index is complete;
everyone else reads it through :func:`read_manifest`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

from canopy_ray.core.files import sha256_file, write_json

MANIFEST = "manifest.json"
ITEMS = "items.parquet"
FORMAT = "canopy-index/1"


def index_checksum(entries: Sequence[dict], extra_files: Sequence[Path]) -> str:
    """One checksum over the shard checksums and the item/node files."""
    h = hashlib.sha256()
    for e in entries:
        h.update(e["sha256"].encode())
    for path in extra_files:
        h.update(sha256_file(path).encode())
    return h.hexdigest()


def write_manifest(root: str | Path, manifest: dict) -> Path:
    """Write ``manifest.json`` (last, atomically) with the format tag and the checksum over
    the shards, the item table and the node vectors."""
    root = Path(root)
    files = [root / ITEMS, root / manifest["node_store"]["vectors"]]
    return write_json(root / MANIFEST, {"format": FORMAT, **manifest,
                                        "checksum": index_checksum(manifest["shards"], files)})


def read_manifest(root: str | Path) -> dict:
    """The manifest of a finished index directory; a clear error when there is none."""
    path = Path(root) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: not an index directory, or the job has not finished")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: unknown index format {manifest.get('format')!r}")
    return manifest


def clear(root: str | Path) -> None:
    """Remove the manifest (and the summary), so a directory being rebuilt is never served."""
    for name in (MANIFEST, "summary.json"):
        (Path(root) / name).unlink(missing_ok=True)
