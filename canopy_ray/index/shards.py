"""FAISS inner-product shards searched together, merged to an exact global top-k.

Item vectors are unit vectors from f0, so inner product is cosine. Two shard kinds:
``sq_fp16`` (the paper's form: ``IndexScalarQuantizer`` with ``QT_fp16``, exact search over
fp16-coded vectors, half the memory) and ``flat`` (``IndexFlatIP``, fp32). Shard s holds
the contiguous rows ``offsets[s] .. offsets[s+1]`` of the item table, so a FAISS label plus
the shard's offset is the item's global position. Each shard returns its own exact top-k;
the union holds the global top-k, which the merge sorts by score (ties: lower position).
Tested against one ``IndexFlatIP`` over the same vectors (``tests/index/test_shards.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import faiss
import numpy as np

from canopy_ray.core.errors import CorruptFileError
from canopy_ray.core.files import atomic_path, sha256_file

INDEX_TYPES = ("sq_fp16", "flat")


def new_index(dim: int, index_type: str = "sq_fp16") -> faiss.Index:
    if index_type == "sq_fp16":
        return faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
    if index_type == "flat":
        return faiss.IndexFlatIP(dim)
    raise ValueError(f"index_type must be one of {INDEX_TYPES}, got {index_type!r}")


def shard_bounds(count: int, n_shards: int) -> list[int]:
    """Offsets of ``n_shards`` contiguous near-equal shards (earlier shards larger)."""
    n_shards = max(1, min(n_shards, count)) if count else 1
    base, extra = divmod(count, n_shards)
    bounds = [0]
    for s in range(n_shards):
        bounds.append(bounds[-1] + base + (1 if s < extra else 0))
    return bounds


def merge_topk(scores: Sequence[np.ndarray], positions: Sequence[np.ndarray], k: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-shard (nq, k_s) results with global positions into the exact top-k."""
    d = np.concatenate(scores, axis=1).astype(np.float32)
    p = np.concatenate(positions, axis=1).astype(np.int64)
    d = np.where(p < 0, -np.inf, d)
    order = np.lexsort((np.where(p < 0, np.iinfo(np.int64).max, p), -d), axis=-1)[:, :k]
    d, p = np.take_along_axis(d, order, 1), np.take_along_axis(p, order, 1)
    if d.shape[1] < k:  # fewer items than k in total
        pad = k - d.shape[1]
        d = np.pad(d, ((0, 0), (0, pad)), constant_values=-np.inf)
        p = np.pad(p, ((0, 0), (0, pad)), constant_values=-1)
    return d, p


class ShardedIndex:
    """N FAISS shards over one item table; ``search`` returns global positions."""

    def __init__(self, shards: list[faiss.Index], offsets: list[int], index_type: str):
        if len(offsets) != len(shards) + 1:
            raise ValueError("offsets must have one entry more than shards")
        self.shards, self.offsets, self.index_type = shards, list(offsets), index_type
        self.dim = shards[0].d if shards else 0

    @property
    def count(self) -> int:
        return self.offsets[-1]

    @classmethod
    def empty(cls, dim: int, bounds: Sequence[int], index_type: str = "sq_fp16") -> "ShardedIndex":
        """Shards to be filled in row order with ``add`` (streaming builds)."""
        shards = [new_index(dim, index_type) for _ in range(len(bounds) - 1)]
        for s in shards:
            if not s.is_trained:
                s.train(np.zeros((1, dim), np.float32))  # fp16 coding needs no statistics
        return cls(shards, list(bounds), index_type)

    @classmethod
    def build(cls, vectors: np.ndarray, n_shards: int = 1, index_type: str = "sq_fp16") -> "ShardedIndex":
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        index = cls.empty(vectors.shape[1], shard_bounds(len(vectors), n_shards), index_type)
        index.add(vectors, 0)
        return index

    def add(self, vectors: np.ndarray, start: int) -> None:
        """Add rows ``start .. start+len(vectors)`` of the item table to their shards."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        end = start + len(vectors)
        for s, shard in enumerate(self.shards):
            a, b = max(start, self.offsets[s]), min(end, self.offsets[s + 1])
            if a < b:
                if shard.ntotal != a - self.offsets[s]:
                    raise ValueError(f"shard {s} must be filled in row order")
                shard.add(vectors[a - start:b - start])

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, positions), each (nq, k); missing results are (-inf, -1)."""
        queries = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        scores, positions = [], []
        for shard, off in zip(self.shards, self.offsets):
            kk = min(k, shard.ntotal)
            if kk == 0:
                continue
            d, i = shard.search(queries, kk)
            scores.append(d)
            positions.append(np.where(i >= 0, i + off, -1))
        if not scores:
            return (np.full((len(queries), k), -np.inf, np.float32), np.full((len(queries), k), -1, np.int64))
        return merge_topk(scores, positions, k)

    def memory_bytes(self) -> int:
        """Serialized size of all shards (what a process holds in RAM to search them)."""
        return int(sum(faiss.serialize_index(s).nbytes for s in self.shards))

    def save(self, out_dir: str | Path, prefix: str = "shard") -> list[dict]:
        """Write ``{prefix}-{s:03d}.faiss`` files; return their manifest entries."""
        out_dir = Path(out_dir)
        entries = []
        for s, shard in enumerate(self.shards):
            path = out_dir / f"{prefix}-{s:03d}.faiss"
            with atomic_path(path) as tmp:
                faiss.write_index(shard, str(tmp))
            entries.append({"file": path.name, "offset": self.offsets[s], "count": int(shard.ntotal),
                            "sha256": sha256_file(path)})
        return entries

    @classmethod
    def load(cls, out_dir: str | Path, entries: Sequence[dict], index_type: str, verify: bool = True,
             mmap: bool = False) -> "ShardedIndex":
        """Contiguous shards from their manifest entries (all of them, or one: a shard replica)."""
        out_dir = Path(out_dir)
        shards, offsets = [], [entries[0]["offset"] if entries else 0]
        for e in entries:
            path = out_dir / e["file"]
            if not path.is_file():
                raise CorruptFileError(path, "missing (the manifest names it)")
            if verify and sha256_file(path) != e["sha256"]:
                raise CorruptFileError(path, "does not match its manifest checksum (changed or truncated)")
            flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
            try:
                shard = faiss.read_index(str(path), flags)
            except RuntimeError as err:  # FAISS's own reader error: truncated or not an index
                raise CorruptFileError(path, f"not a readable FAISS index (truncated?): "
                                             f"{str(err).strip().splitlines()[-1]}") from None
            if shard.ntotal != e["count"] or offsets[-1] != e["offset"]:
                raise CorruptFileError(path, f"{shard.ntotal} vectors at offset {offsets[-1]}, "
                                             f"the manifest says {e['count']} at {e['offset']}")
            shards.append(shard)
            offsets.append(offsets[-1] + shard.ntotal)
        return cls(shards, offsets, index_type)


def to_gpus(index: ShardedIndex, gpus: Sequence[int] | None = None) -> ShardedIndex:
    """The same shards on the GPUs FAISS sees (round-robin, one resource object per GPU), or
    ``index`` itself when it sees none (a faiss-cpu install, or no device).

    FAISS has no GPU form of a flat ``IndexScalarQuantizer``, so an ``sq_fp16`` shard goes as a
    GPU flat index storing fp16 (``useFloat16``) of the same decoded vectors: the same exact
    inner-product search over the same fp16 values (:func:`gpu_flat`). Positions and merging
    are unchanged, so results equal the CPU index's up to float summation order.
    """
    gpus = list(range(faiss.get_num_gpus())) if gpus is None else list(gpus)
    if not gpus or not index.shards:
        return index
    options = faiss.GpuClonerOptions()
    options.useFloat16 = index.index_type == "sq_fp16"
    resources = {g: faiss.StandardGpuResources() for g in gpus}
    moved = []
    for s, shard in enumerate(index.shards):
        g = gpus[s % len(gpus)]
        moved.append(faiss.index_cpu_to_gpu(resources[g], g, gpu_flat(shard), options))
    out = ShardedIndex(moved, index.offsets, index.index_type)
    out.gpu_resources = resources  # the GPU indexes need them alive
    return out


def gpu_flat(shard: faiss.Index) -> faiss.Index:
    """A CPU ``IndexFlatIP`` of a shard's stored vectors (fp16-decoded for ``sq_fp16``): the form
    ``index_cpu_to_gpu`` accepts. A flat shard is returned as it is."""
    if isinstance(shard, faiss.IndexFlat):
        return shard
    flat = faiss.IndexFlatIP(shard.d)
    if shard.ntotal:
        flat.add(shard.reconstruct_n(0, shard.ntotal))
    return flat
