"""The one owner of an index directory's on-disk format: file names and ``manifest.json``.

Layout written by :mod:`canopy_ray.index.job`::

    DIR/manifest.json         format, model id, dim, count, adapter id, index type, checksums;
                              for ivf: nlist and ivf_recall (recall measured, nprobe chosen)
    DIR/shard-000.faiss ...   FAISS shards (rows in item-table order)
    DIR/items.parquet         the item table: id, modality, canonical item JSON
    DIR/nodes.f16.npy, node_spans.npy, node_items.parquet   the node store
    DIR/summary.json, report.json, skipped.jsonl             what the job did and skipped
    DIR/index-config.yaml, rebuild.json                       the config and corpus it was built from

``manifest.json`` is written last (atomically), so its presence means the index is complete;
everyone else reads it through :func:`read_manifest`. It holds the SHA-256 of every file, so
a file changed or truncated after the job is caught at load (:mod:`canopy_ray.index.reader`);
every such error names the file and :func:`rebuild_command`, the command that writes the
index again (from the job's finished parts when they are still there, so it is quick).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import Sequence

from canopy_ray.core.errors import CorruptFileError
from canopy_ray.core.files import sha256_file, write_json, write_text

MANIFEST = "manifest.json"
ITEMS = "items.parquet"
CONFIG, REBUILD = "index-config.yaml", "rebuild.json"
FORMAT = "canopy-index/1"
# An ivf index's measured recall (RecallProbe.tune): {"k", "queries", "seed", "target", "nprobe",
# "recall", "by_nprobe"}, written by the index writer.
IVF_RECALL = "ivf_recall"


def index_checksum(entries: Sequence[dict], file_digests: Sequence[str]) -> str:
    """One checksum over the shard checksums and those of the item/node files."""
    h = hashlib.sha256()
    for e in entries:
        h.update(e["sha256"].encode())
    for digest in file_digests:
        h.update(digest.encode())
    return h.hexdigest()


def write_manifest(root: str | Path, manifest: dict) -> Path:
    """Write ``manifest.json`` (last, atomically) with the format tag, ``files``: the SHA-256
    of the item table and of each node store file (the shards carry their own), and one
    checksum over the shards, the item table and the node vectors."""
    root = Path(root)
    store = manifest["node_store"]
    names = [ITEMS] + [store[k] for k in ("vectors", "spans", "items") if k in store]
    files = {name: sha256_file(root / name) for name in names}
    checksum = index_checksum(manifest["shards"], [files[ITEMS], files[store["vectors"]]])
    return write_json(root / MANIFEST, {"format": FORMAT, **manifest, "files": files, "checksum": checksum})


def read_manifest(root: str | Path) -> dict:
    """The manifest of a finished index directory; a clear error (with the command that
    rebuilds the index) when there is none or it is torn."""
    path = Path(root) / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: not an index directory, or the job has not finished "
                                f"(finish or rebuild it with: {rebuild_command(root)})")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptFileError(path, f"torn or truncated, not valid JSON ({e})", rebuild_command(root)) from None
    if not isinstance(manifest, dict):
        raise CorruptFileError(path, "not a JSON object", rebuild_command(root))
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: unknown index format {manifest.get('format')!r}")
    return manifest


def search_nprobe(manifest: dict, nprobe: int | str) -> int | None:
    """The ``nprobe`` a search of this index runs with: ``nprobe`` when it is a number
    (``retrieval.nprobe`` set by hand); for ``"auto"``, the one measured at indexing to reach
    ``retrieval.recall_target`` (``ivf_recall``), or every list (``nlist``: the exact answer over
    the codes) for an ivf index written before indexing measured it. None for exact index types."""
    if manifest.get("index_type") != "ivf":
        return None
    if nprobe != "auto":
        return int(nprobe)
    measured = manifest.get(IVF_RECALL)
    return int(measured["nprobe"]) if measured else int(manifest["nlist"])


def write_job_files(root: str | Path, config: dict, corpus: Path, media_root: Path) -> None:
    """Keep beside the index what rebuilds it: the resolved config and the corpus paths."""
    import yaml

    root = Path(root)
    write_text(root / CONFIG, "# the config this index was built with (canopy index --config)\n"
               + yaml.safe_dump(config, sort_keys=False))
    write_json(root / REBUILD, {"corpus": str(corpus.resolve()), "media_root": str(media_root.resolve())})


def rebuild_command(root: str | Path, config: str | None = None, overwrite: bool = False) -> str:
    """The shell command that writes the index in ``root`` again: with the config it was built
    with (``index-config.yaml``) unless ``config`` names another; ``overwrite`` when the
    settings change (another adapter), else it reuses the job's finished parts."""
    root = Path(root).resolve()
    try:
        job = json.loads((root / REBUILD).read_text(encoding="utf-8"))
        corpus, media_root = job["corpus"], job.get("media_root")
    except (OSError, ValueError, KeyError, TypeError):  # an index from before rebuild.json: say what to fill in
        corpus, media_root, overwrite = "CORPUS", None, True
    if config is None:
        config = str(root / CONFIG) if (root / CONFIG).is_file() else "CONFIG"
    args = ["canopy", "index", "--config", config, "--corpus", corpus, "--out", str(root)]
    if media_root and Path(media_root) != (Path(corpus) if Path(corpus).is_dir() else Path(corpus).parent):
        args += ["--media-root", media_root]
    return shlex.join(args + (["--overwrite"] if overwrite else []))


def clear(root: str | Path) -> None:
    """Remove the manifest (and the summary), so a directory being rebuilt is never served."""
    for name in (MANIFEST, "summary.json"):
        (Path(root) / name).unlink(missing_ok=True)
