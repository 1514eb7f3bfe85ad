"""Write an index directory from item rows in order: FAISS shards, item table, node store, manifest.

The index job calls :class:`IndexWriter` once its items are embedded (``job._fill``);
``benchmarks/scale.py`` feeds it synthetic vectors, so both measure and ship the same code.
Rows arrive in chunks, in item-table order. Exact shards (``sq_fp16``, ``flat``) stream to their
files as the rows arrive (:class:`~canopy_ray.index.shards.ShardFile`), so building holds one
chunk in memory; an ``ivf`` shard is held until its last row, then written and released (one
shard in memory, never the whole index). Node vectors go straight to their memory-mapped file. An
``ivf`` index measures its recall as its rows pass (:class:`~canopy_ray.index.shards.RecallProbe`) and
records it with the ``nprobe`` chosen. The manifest is written last
(:func:`canopy_ray.index.manifest.write_manifest`): until then the directory is not an index.
"""

from __future__ import annotations

from pathlib import Path
import numpy as np

from canopy_ray.core.files import atomic_path
import canopy_ray.index.manifest as manifest
from canopy_ray.index.node_store import NodeStoreWriter
from canopy_ray.index.shards import RecallProbe, ShardedIndex, ShardFile, save_shard, shard_bounds, shard_file, trained


class IndexWriter:
    """``count`` items of dimension ``dim`` in ``shards`` contiguous FAISS shards of
    ``index_type``; ``nodes`` cached node vectors in all (0: no node store contents, every node
    is encoded online). An ``ivf`` index needs ``sample``, item vectors to train its lists on, and
    ``recall``, the probe it measures its recall with (the vectors of ``RecallProbe.rows_for(count)``)."""

    def __init__(self, out_dir: str | Path, *, count: int, dim: int, nodes: int = 0, index_type: str = "sq_fp16",
                 shards: int = 1, sample: np.ndarray | None = None, nlist: int | None = None,
                 recall: RecallProbe | None = None):
        import faiss
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        manifest.clear(self.out)
        if index_type == "ivf" and recall is None:
            raise ValueError("an ivf index measures its recall on a sample of its own vectors; no RecallProbe was given")
        self.count, self.dim, self.index_type, self.recall = count, dim, index_type, recall
        self.bounds = shard_bounds(count, shards)
        self._template = trained(dim, index_type, sample, nlist)
        self.nlist = int(self._template.nlist) if isinstance(self._template, faiss.IndexIVF) else None
        self._streams = isinstance(self._template, faiss.IndexFlatCodes)
        self._s, self.entries, self.at = 0, [], 0
        self._shard = self._open(0)
        self.nodes = NodeStoreWriter(self.out, nodes, dim)
        self._items_ctx = atomic_path(self.out / manifest.ITEMS)
        tmp = self._items_ctx.__enter__()
        schema = pa.schema([("id", pa.string()), ("modality", pa.string()), ("item", pa.string())])
        self._items = pq.ParquetWriter(tmp, schema)

    def add(self, ids, modalities, items, vectors: np.ndarray, node_counts: np.ndarray | None = None,
            node_spans: np.ndarray | None = None, node_vectors: np.ndarray | None = None) -> None:
        """The next ``len(vectors)`` items: their ids, modalities and canonical item JSON (lists or
        Arrow arrays), float32 unit vectors, and (when the store caches them) per item its node
        count, with all their spans ``(n, 2)`` and vectors ``(n, dim)`` in item order."""
        import pyarrow as pa

        n = len(vectors)
        if self.at + n > self.count:
            raise ValueError(f"{self.at + n} items written, the writer was opened for {self.count}")
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        self._add_vectors(vectors)
        if self.recall is not None:
            self.recall.add(vectors, self.at)
        self._items.write_table(pa.table({"id": ids, "modality": modalities, "item": items}))
        if node_counts is not None:
            self.nodes.add_many(ids, np.asarray(node_counts), node_spans, node_vectors)
        self.at += n

    def _open(self, s: int):
        import faiss

        if s >= max(1, len(self.bounds) - 1):
            return None
        if self._streams:
            return ShardFile(self.out / shard_file(s), self._template)
        return faiss.clone_index(self._template)

    def _add_vectors(self, vectors: np.ndarray) -> None:
        """Rows ``at .. at+len`` into the open shard, finishing each shard as it fills."""
        done = 0
        while done < len(vectors):
            end = self.bounds[self._s + 1]
            take = min(len(vectors) - done, end - (self.at + done))
            self._shard.add(vectors[done:done + take])
            done += take
            if self.at + done == end:
                self._finish()

    def _finish(self) -> None:
        offset = self.bounds[self._s]
        if self._streams:
            self.entries.append(self._shard.close(offset))
        else:
            self.entries.append(save_shard(self._shard, self.out / shard_file(self._s), offset))
        self._s += 1
        self._shard = self._open(self._s)

    def close(self, **fields) -> dict:
        """Finish the item table and node store, then write the manifest with ``fields``
        (``model_id``, ``adapter_id``, ... as the reader checks them); return it."""
        if self.at != self.count:
            raise ValueError(f"the writer was opened for {self.count} items, {self.at} were added")
        if self.count == 0:  # no rows: one empty shard, so the index still loads (and finds nothing)
            self._finish()
        self._items.close()
        self._items_ctx.__exit__(None, None, None)
        node_entry = self.nodes.close()
        body = {**fields, "dim": self.dim, "count": self.count, "nodes": node_entry["nodes"],
                "index_type": self.index_type, "metric": "inner_product", "shards": self.entries,
                "node_store": node_entry, "items": manifest.ITEMS}
        if self.nlist is not None:  # the shards as written, mapped: the searches a load will run
            body["nlist"] = self.nlist
            body[manifest.IVF_RECALL] = self.recall.tune(ShardedIndex.load(self.out, self.entries, "ivf",
                                                                           verify=False, mmap=True))
        manifest.write_manifest(self.out, body)
        return manifest.read_manifest(self.out)
