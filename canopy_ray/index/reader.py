"""An index directory as the online pipeline sees it: FAISS shards, items, cached nodes.

The layout and the manifest belong to :mod:`canopy_ray.index.manifest`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from canopy_ray.core.errors import CorruptFileError, IndexMismatchError
from canopy_ray.core.files import sha256_file
from canopy_ray.core.items import Item, parse_item
from canopy_ray.index.ids import ItemIds
from canopy_ray.index.manifest import CONFIG, ITEMS, MANIFEST, read_manifest, rebuild_command, search_nprobe
from canopy_ray.index.node_store import NodeStore
from canopy_ray.index.shards import ShardedIndex


class CanopyIndex:
    """Search item vectors, fetch items, look up cached node vectors."""

    def __init__(self, root: Path, manifest: dict, shards: ShardedIndex, ids: "ItemIds | Sequence[str]",
                 nodes: NodeStore):
        ids = ids if isinstance(ids, ItemIds) else ItemIds(ids)
        self.root, self.manifest, self.shards, self.ids, self.nodes = root, manifest, shards, ids, nodes
        self._items_json = None
        self._modality: np.ndarray | None = None

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    @property
    def count(self) -> int:
        return int(self.manifest["count"])

    def search(self, queries: np.ndarray, k: int,
               modalities: Sequence[str] | None = None) -> list[list[tuple[str, float]]]:
        """Top-k ``(item_id, score)`` per query (unit query vectors from f0), among the items of
        the given ``modalities`` only (the router's sub-indexes) when they are named."""
        allowed = None if modalities is None else np.isin(self._modalities(), list(modalities))
        if allowed is None or allowed.all():
            return self._hits(*self.shards.search(queries, k), None, k)
        # Exact top-k of the subset: widen the search until k allowed items are among the
        # hits (every allowed item scoring higher is then among them too) or all were seen.
        want, kk = min(k, int(allowed.sum())), k
        while True:
            kk = min(kk * 4, self.count)
            hits = self._hits(*self.shards.search(queries, kk), allowed, k)
            if kk == self.count or all(len(h) >= want for h in hits):
                return hits

    def _hits(self, scores, positions, allowed, k) -> list[list[tuple[str, float]]]:
        keep = lambda p: p >= 0 and (allowed is None or allowed[p])  # noqa: E731
        out = []
        for srow, prow in zip(scores, positions):
            kept = [(p, float(s)) for s, p in zip(srow, prow) if keep(p)][:k]
            ids = self.ids.array.take(np.array([p for p, _ in kept], np.int64)).to_pylist() if kept else []
            out.append(list(zip(ids, [s for _, s in kept])))
        return out

    def _modalities(self) -> np.ndarray:
        if self._modality is None:
            import pyarrow.parquet as pq

            self._modality = pq.read_table(self.root / ITEMS, columns=["modality"]).column("modality").to_numpy(
                zero_copy_only=False).astype(str)
        return self._modality

    def item(self, item_id: str) -> Item:
        if self._items_json is None:  # an Arrow column: no Python string per item until it is fetched
            import pyarrow.parquet as pq

            self._items_json = pq.read_table(self.root / ITEMS, columns=["item"]).column("item").combine_chunks()
        return parse_item(json.loads(self._items_json[self.ids.position(item_id)].as_py()))

    def items(self, item_ids: Sequence[str]) -> list[Item]:
        return [self.item(i) for i in item_ids]


def load_index(root: str | Path, verify: bool = True, mmap: bool = True, expect=None,
               nprobe: int | str = "auto") -> CanopyIndex:
    """Open an index directory; ``verify`` checks the shard and item-table checksums against
    the manifest (the node store is checked from its sizes either way); ``mmap`` maps the shards
    and node vectors instead of reading them (processes on one node share one copy); ``nprobe``
    is the ``ivf`` search knob (``retrieval.nprobe``; ``"auto"``: the value measured at indexing,
    :func:`~canopy_ray.index.manifest.search_nprobe`). ``expect``, a
    :class:`~canopy_ray.config.CanopyConfig`, refuses an index built with another encoder
    (:func:`check_encoder`). Every fault is a :class:`CorruptFileError` naming the file and
    the command that rebuilds the index."""
    root = Path(root)
    manifest = read_manifest(root)
    if expect is not None:
        check_encoder(root, manifest, expect)
    try:
        shards = ShardedIndex.load(root, manifest["shards"], manifest["index_type"], verify=verify,
                                   mmap=mmap).set_nprobe(search_nprobe(manifest, nprobe))
        if shards.count != manifest["count"]:
            raise CorruptFileError(root / MANIFEST, f"shards hold {shards.count} vectors, it says {manifest['count']}")
        ids = _item_ids(root, manifest, verify)
        nodes = NodeStore.load(root, manifest["adapter_id"], manifest["model_id"], mmap=mmap,
                               nodes=manifest.get("nodes"))
    except CorruptFileError as e:
        raise e.with_rebuild(rebuild_command(root)) from None
    return CanopyIndex(root, manifest, shards, ids, nodes)


def _item_ids(root: Path, manifest: dict, verify: bool) -> ItemIds:
    import pyarrow.parquet as pq

    path = root / ITEMS
    want = manifest.get("files", {}).get(ITEMS)  # absent in indexes written before per-file checksums
    if not path.is_file():
        raise CorruptFileError(path, "missing (the manifest names it)")
    if verify and want and sha256_file(path) != want:
        raise CorruptFileError(path, "does not match its manifest checksum (changed or truncated)")
    try:
        ids = ItemIds(pq.read_table(path, columns=["id"]).column("id"))
    except (OSError, ValueError, KeyError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise CorruptFileError(path, f"not a readable item table (truncated?): {e}") from None
    if len(ids) != manifest["count"]:
        raise CorruptFileError(path, f"{len(ids)} rows, the manifest says {manifest['count']} items")
    if not verify or not want:  # a checked file is the one the job wrote, ids distinct: not sorted at load
        dup = ids.duplicates()
        if dup:
            raise CorruptFileError(path, f"{len(ids)} rows ({len(ids) - dup} distinct ids), the manifest says "
                                         f"{manifest['count']} items")
    return ids


def check_encoder(root: str | Path, manifest: dict, cfg) -> None:
    """Refuse an index whose vectors another encoder made: item vectors from another base
    model (search would rank by unrelated vectors) or a node store from another adapter than
    ``cfg.models.adapter`` (every cached node vector would be stale)."""
    from canopy_ray.models.adapters import model_id
    from canopy_ray.models.adapters import adapter_id

    path = Path(root) / MANIFEST
    model, adapter = model_id(cfg), adapter_id(cfg.models.adapter)
    if manifest.get("model_id") != model:
        problem = f"built with base model {manifest.get('model_id')!r}, but the encoder here is {model!r}"
    elif manifest.get("adapter_id") != adapter:
        problem = (f"its node store was made by adapter {manifest.get('adapter_id')!r}, but the node encoder "
                   f"here is {adapter!r} (models.adapter: {cfg.models.adapter or 'null'})")
    else:
        return
    raise IndexMismatchError(path, f"{problem}; load it with the config it was built with "
                                   f"({Path(root) / CONFIG}), or make it for this encoder (CONFIG: "
                                   f"the config that loads it)",
                             rebuild_command(root, config="CONFIG", overwrite=True))


def load_shard(root: str | Path, shard: int, verify: bool = True, nprobe: int | str = "auto",
               mmap: bool = True) -> ShardedIndex:
    """One FAISS shard of an index (a Serve replica holding one shard); global positions;
    ``nprobe`` as :func:`load_index`'s."""
    manifest = read_manifest(root)
    try:
        return ShardedIndex.load(root, manifest["shards"][shard:shard + 1], manifest["index_type"], verify=verify,
                                 mmap=mmap).set_nprobe(search_nprobe(manifest, nprobe))
    except CorruptFileError as e:
        raise e.with_rebuild(rebuild_command(root)) from None
