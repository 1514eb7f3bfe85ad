"""Cached f_theta node embeddings, fp16, keyed by item id, loadable by memory map.

Node embeddings do not depend on the query, so the indexing job stores every node of every
item (pre-order, as ``ItemTree.nodes()`` lists them) beside the index:

- ``nodes.f16.npy``  (N, dim) float16 unit vectors, opened with ``np.load(mmap_mode="r")``;
- ``node_spans.npy`` (N, 2) int32 leaf spans ``[start, end)``;
- ``node_items.parquet``: ``item_id, offset, count`` (rows of the two arrays per item).

Online, :class:`canopy_ray.compressor.Compressor` looks each item up (``lookup``) when the
store was written by its node encoder (``usable_for``: same ``adapter_id`` and model) and
encodes only the spans the store does not hold (another branching factor, say).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from canopy_ray.core.errors import CorruptFileError
from canopy_ray.core.files import atomic_path
from canopy_ray.core.hierarchy import Span
from canopy_ray.index.ids import ItemIds, Rows

VECTORS, SPANS, ITEMS = "nodes.f16.npy", "node_spans.npy", "node_items.parquet"


class NodeStoreWriter:
    """Fills the store row by row; the total node count is known up front."""

    def __init__(self, out_dir: str | Path, total_nodes: int, dim: int):
        self.out_dir = Path(out_dir)
        self._vec_tmp = self.out_dir / (VECTORS + ".tmp")
        self._span_tmp = self.out_dir / (SPANS + ".tmp")
        self.vectors = np.lib.format.open_memmap(self._vec_tmp, mode="w+", dtype=np.float16,
                                                 shape=(total_nodes, dim))
        self.spans = np.lib.format.open_memmap(self._span_tmp, mode="w+", dtype=np.int32,
                                               shape=(total_nodes, 2))
        self.item_ids: list[str] = []
        self.offsets: list[int] = []
        self.counts: list[int] = []
        self.at = 0

    def add(self, item_id: str, spans: np.ndarray, vectors: np.ndarray) -> None:
        n = len(spans)
        self.vectors[self.at:self.at + n] = vectors.astype(np.float16)
        self.spans[self.at:self.at + n] = spans
        self.item_ids.append(item_id)
        self.offsets.append(self.at)
        self.counts.append(n)
        self.at += n

    def add_many(self, item_ids, counts: np.ndarray, spans: np.ndarray, vectors: np.ndarray) -> None:
        """Consecutive items at once: ``counts[i]`` rows of ``spans``/``vectors`` for item i
        (one slice assignment for the chunk instead of one per item)."""
        n = int(np.sum(counts))
        if len(spans) != n or len(vectors) != n:
            raise ValueError(f"{len(spans)} spans and {len(vectors)} vectors for {n} nodes")
        self.vectors[self.at:self.at + n] = vectors
        self.spans[self.at:self.at + n] = spans
        self.item_ids.extend(item_ids.to_pylist() if hasattr(item_ids, "to_pylist") else list(item_ids))
        self.offsets.extend((self.at + np.concatenate([[0], np.cumsum(counts)[:-1]])).tolist())
        self.counts.extend(np.asarray(counts).tolist())
        self.at += n

    def close(self) -> dict:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.at != len(self.vectors):
            raise ValueError(f"node store expected {len(self.vectors)} nodes, got {self.at}")
        self.vectors.flush()
        self.spans.flush()
        del self.vectors, self.spans
        self._vec_tmp.replace(self.out_dir / VECTORS)
        self._span_tmp.replace(self.out_dir / SPANS)
        table = pa.table({"item_id": self.item_ids, "offset": pa.array(self.offsets, pa.int64()),
                          "count": pa.array(self.counts, pa.int32())})
        with atomic_path(self.out_dir / ITEMS) as tmp:
            pq.write_table(table, tmp)
        return {"vectors": VECTORS, "spans": SPANS, "items": ITEMS, "nodes": self.at,
                "dtype": "float16"}


class NodeStore:
    """Lookup of cached node vectors with on-the-fly fallback."""

    def __init__(self, vectors: np.ndarray | None, spans: np.ndarray | None, rows: "dict[str, tuple[int, int]] | Rows",
                 adapter_id: str | None, model_id: str | None = None):
        self._vectors, self._spans, self._rows = vectors, spans, rows
        self.adapter_id, self.model_id = adapter_id, model_id

    @classmethod
    def empty(cls) -> "NodeStore":
        """No cache: every node is encoded on the fly."""
        return cls(None, None, {}, None)

    @classmethod
    def load(cls, out_dir: str | Path, adapter_id: str, model_id: str | None = None,
             mmap: bool = True, nodes: int | None = None) -> "NodeStore":
        """Open the store; a truncated or inconsistent file is a :class:`CorruptFileError`
        naming it (checked from sizes and headers, without reading the vectors). ``nodes``:
        the node count the manifest records."""
        import pyarrow.parquet as pq

        out_dir = Path(out_dir)
        vectors = _load_array(out_dir / VECTORS, np.float16, mmap)
        spans = _load_array(out_dir / SPANS, np.int32, mmap)
        if spans.shape[1] != 2 or len(spans) != len(vectors) or (nodes is not None and len(vectors) != nodes):
            raise CorruptFileError(out_dir / VECTORS, f"{len(vectors)} vectors and {len(spans)} spans, the "
                                   f"manifest says {nodes} nodes (one of the files was changed)")
        try:  # columns, not a dict: a million items are three arrays, checked without a loop
            t = pq.read_table(out_dir / ITEMS)
            offsets = t.column("offset").to_numpy().astype(np.int64)
            counts = t.column("count").to_numpy().astype(np.int64)
            rows = Rows(ItemIds(t.column("item_id")), offsets, counts)
        except (OSError, ValueError, KeyError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise CorruptFileError(out_dir / ITEMS, f"not a readable node table (truncated?): {e}") from None
        if counts.sum() != len(vectors) or (offsets < 0).any() or (offsets + counts > len(vectors)).any():
            raise CorruptFileError(out_dir / ITEMS, f"its rows do not cover the {len(vectors)} stored nodes")
        return cls(vectors, spans, rows, adapter_id, model_id)

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, item_id: str) -> bool:
        return item_id in self._rows

    @property
    def n_nodes(self) -> int:
        return 0 if self._vectors is None else len(self._vectors)

    def lookup(self, item_id: str) -> dict[Span, np.ndarray] | None:
        """Cached vectors of one item by span (float32), or None when it is not cached."""
        row = self._rows.get(item_id)
        if row is None:
            return None
        o, c = row
        spans = self._spans[o:o + c]
        vecs = np.asarray(self._vectors[o:o + c], dtype=np.float32)
        return {(int(a), int(b)): v for (a, b), v in zip(spans, vecs)}

    def usable_for(self, encoder) -> bool:
        """The cache holds this encoder's node vectors (same adapter, same model)."""
        if encoder is None:
            return True
        if getattr(encoder, "adapter_id", None) != self.adapter_id:
            return False
        return self.model_id is None or getattr(encoder, "model_id", self.model_id) == self.model_id


def _load_array(path: Path, dtype, mmap: bool) -> np.ndarray:
    """A 2-d ``.npy`` of the store, its size checked against its header before it is mapped
    (a truncated file would otherwise fail later, or map garbage, with no file named)."""
    if not path.is_file():
        raise CorruptFileError(path, "missing (the manifest names it)")
    fmt = np.lib.format
    try:
        with open(path, "rb") as f:
            version = fmt.read_magic(f)
            read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _, dt = read_header(f)
            start = f.tell()
    except (OSError, ValueError, EOFError) as e:
        raise CorruptFileError(path, f"not a readable .npy array (truncated?): {e}") from None
    want, size = start + int(np.prod(shape)) * dt.itemsize, path.stat().st_size
    if size != want:
        raise CorruptFileError(path, f"{size} bytes where its header says {want} (truncated or changed)")
    if dt != np.dtype(dtype) or len(shape) != 2:
        raise CorruptFileError(path, f"a {dt} array of shape {shape}, expected 2-d {np.dtype(dtype)}")
    return np.load(path, mmap_mode="r" if mmap else None)
