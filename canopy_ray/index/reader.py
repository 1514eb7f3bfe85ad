"""An index directory as the online pipeline sees it: FAISS shards, items, cached nodes.

The layout and the manifest belong to :mod:`canopy_ray.index.manifest`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from canopy_ray.core.items import Item, parse_item
from canopy_ray.index.manifest import ITEMS, read_manifest
from canopy_ray.index.node_store import NodeStore
from canopy_ray.index.shards import ShardedIndex


class CanopyIndex:
    """Search item vectors, fetch items, look up cached node vectors."""

    def __init__(self, root: Path, manifest: dict, shards: ShardedIndex, ids: list[str],
                 nodes: NodeStore):
        self.root, self.manifest, self.shards, self.ids, self.nodes = root, manifest, shards, ids, nodes
        self._items_json: list[str] | None = None
        self._modality: np.ndarray | None = None
        self._pos = {i: p for p, i in enumerate(ids)}

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
        return [[(self.ids[p], float(s)) for s, p in zip(srow, prow) if keep(p)][:k]
                for srow, prow in zip(scores, positions)]

    def _modalities(self) -> np.ndarray:
        if self._modality is None:
            import pyarrow.parquet as pq

            self._modality = pq.read_table(self.root / ITEMS, columns=["modality"]).column("modality").to_numpy(
                zero_copy_only=False).astype(str)
        return self._modality

    def item(self, item_id: str) -> Item:
        if self._items_json is None:
            import pyarrow.parquet as pq

            self._items_json = pq.read_table(self.root / ITEMS, columns=["item"]).column("item").to_pylist()
        return parse_item(json.loads(self._items_json[self._pos[item_id]]))

    def items(self, item_ids: Sequence[str]) -> list[Item]:
        return [self.item(i) for i in item_ids]


def load_index(root: str | Path, verify: bool = True, mmap: bool = True) -> CanopyIndex:
    """Open an index directory; ``verify`` checks the shard checksums against the manifest."""
    import pyarrow.parquet as pq

    root = Path(root)
    manifest = read_manifest(root)
    shards = ShardedIndex.load(root, manifest["shards"], manifest["index_type"], verify=verify, mmap=mmap)
    if shards.count != manifest["count"]:
        raise ValueError(f"{root}: shards hold {shards.count} vectors, the manifest says {manifest['count']}")
    ids = pq.read_table(root / ITEMS, columns=["id"]).column("id").to_pylist()
    nodes = NodeStore.load(root, manifest["adapter_id"], manifest["model_id"], mmap=mmap)
    return CanopyIndex(root, manifest, shards, ids, nodes)


def load_shard(root: str | Path, shard: int, verify: bool = True) -> ShardedIndex:
    """One FAISS shard of an index (a Serve replica holding one shard); global positions."""
    manifest = read_manifest(root)
    return ShardedIndex.load(root, manifest["shards"][shard:shard + 1], manifest["index_type"], verify=verify)
