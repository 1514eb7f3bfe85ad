"""FAISS inner-product shards searched together, merged to an exact global top-k.

Item vectors are unit vectors from f0, so inner product is cosine. Three shard kinds:
``sq_fp16`` (the paper's form: ``IndexScalarQuantizer`` with ``QT_fp16``, exact search over
fp16-coded vectors, half the memory), ``flat`` (``IndexFlatIP``, fp32) and ``ivf`` (approximate:
``IndexIVFScalarQuantizer`` over the same fp16 codes, ``nlist`` lists trained once on a sample
and shared by every shard; a query scans the ``nprobe`` nearest lists). Shard s holds
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

INDEX_TYPES = ("sq_fp16", "flat", "ivf")
# Reading maps the stored codes (flat and IVF alike) instead of copying them: replicas on one
# node share one copy in the page cache, and a load reads nothing until a search touches it.
MMAP_FLAGS = faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY


def new_index(dim: int, index_type: str = "sq_fp16", nlist: int = 1) -> faiss.Index:
    if index_type == "sq_fp16":
        return faiss.IndexScalarQuantizer(dim, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT)
    if index_type == "flat":
        return faiss.IndexFlatIP(dim)
    if index_type == "ivf":  # fp16 codes of the vectors themselves (no residual): the flat form's scores
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFScalarQuantizer(quantizer, dim, nlist, faiss.ScalarQuantizer.QT_fp16,
                                              faiss.METRIC_INNER_PRODUCT, False)
        quantizer.this.disown()  # the index frees its quantizer, not Python
        index.own_fields = True
        index.cp.niter = 10  # k-means iterations; more changes recall little and costs minutes at scale
        return index
    raise ValueError(f"index_type must be one of {INDEX_TYPES}, got {index_type!r}")


def auto_nlist(count: int) -> int:
    """IVF lists for ``count`` items: the power of two nearest sqrt(count), 1024 at most (the
    k-means training and the assignment of every vector to a list grow with it on CPU)."""
    return int(min(1024, 2 ** round(np.log2(max(1.0, np.sqrt(max(count, 1)))))))


def train_size(nlist: int, count: int) -> int:
    """Training vectors for ``nlist`` lists (FAISS asks for 39 per list at least)."""
    return int(min(count, 64 * nlist))


def trained(dim: int, index_type: str, sample: np.ndarray | None = None, nlist: int | None = None) -> faiss.Index:
    """An empty index ready for ``add``: fp16 coding needs no statistics; ``ivf`` trains its
    lists on ``sample`` (a random sample of the item vectors)."""
    if index_type != "ivf":
        index = new_index(dim, index_type)
        if not index.is_trained:
            index.train(np.zeros((1, dim), np.float32))
        return index
    if sample is None or not len(sample):
        raise ValueError("an ivf index is trained on a sample of the item vectors; none was given")
    sample = np.ascontiguousarray(sample, dtype=np.float32)
    index = new_index(dim, "ivf", min(nlist or auto_nlist(len(sample)), len(sample)))
    index.train(sample)
    return index


def sample_rows(total: int, n: int, seed: int = 0) -> np.ndarray:
    """``n`` distinct row numbers of ``total``, sorted (an ``ivf`` index's training sample, and
    the queries it measures its recall on)."""
    n = min(n, total)
    return np.sort(np.random.default_rng(seed).choice(total, n, replace=False))


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean share of each query's exact top-k positions (rows of ``exact``) that ``found`` holds."""
    k = exact.shape[1]
    return float(np.mean([len(set(f[f >= 0]) & set(e[e >= 0])) / k for f, e in zip(found, exact)])) if len(exact) else 1.0


class RecallProbe:
    """How an ``ivf`` index measures its own recall: ``queries``, the stored vectors of ``rows``
    (a seeded sample of the index's rows, :func:`sample_rows` with ``RECALL_SEED``), get their
    exact top-k neighbours (fp32 inner product, as ``IndexFlatIP``) gathered while the rows stream
    past in order (:meth:`add`); :meth:`tune` then finds the smallest ``nprobe`` whose recall@k
    against them reaches ``target``. A query is a row of the index, so its own row is left out
    of both lists (it would be a free hit): recall is over its k nearest other rows."""

    K, QUERIES, SEED = 10, 300, 1

    def __init__(self, rows: np.ndarray, queries: np.ndarray, target: float):
        self.rows = np.asarray(rows, np.int64)
        self.queries = np.ascontiguousarray(queries, dtype=np.float32)
        self.target = float(target)
        self._scores = np.zeros((len(self.rows), 0), np.float32)
        self._positions = np.zeros((len(self.rows), 0), np.int64)

    @classmethod
    def rows_for(cls, count: int) -> np.ndarray:
        return sample_rows(count, cls.QUERIES, cls.SEED)

    def add(self, vectors: np.ndarray, start: int) -> None:
        """Rows ``start .. start+len(vectors)`` of the index: keep each query's exact top-(k+1)."""
        if not len(vectors) or not len(self.rows):
            return
        d, i = faiss.knn(self.queries, np.ascontiguousarray(vectors, dtype=np.float32),
                         min(self.K + 1, len(vectors)), metric=faiss.METRIC_INNER_PRODUCT)
        self._scores, self._positions = merge_topk([self._scores, d], [self._positions, i + start], self.K + 1)

    def _others(self, positions: np.ndarray) -> np.ndarray:
        """Each query's top-k positions other than its own row."""
        return np.stack([p[p != r][:self.K] for p, r in zip(positions, self.rows)])

    def tune(self, index: "ShardedIndex") -> dict:
        """Set ``index`` to the smallest ``nprobe`` reaching the target (every list when none
        does) and return the record the manifest keeps. Recall grows with ``nprobe`` (more lists
        scanned, more candidates), so a binary search over 1..nlist finds it in ~log2(nlist) searches."""
        exact = self._others(self._positions)
        nlist = index.shards[0].nlist
        measured: dict[int, float] = {}

        def at(p: int) -> float:
            if p not in measured:
                measured[p] = recall(self._others(index.set_nprobe(p).search(self.queries, self.K + 1)[1]), exact)
            return measured[p]

        lo, hi = 1, nlist
        if at(hi) >= self.target:
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if at(mid) >= self.target else (mid + 1, hi)
        index.set_nprobe(hi)
        return {"k": self.K, "queries": len(self.rows), "seed": self.SEED, "target": self.target, "nprobe": hi,
                "recall": round(at(hi), 4), "by_nprobe": {str(p): round(r, 4) for p, r in sorted(measured.items())}}


def set_nprobe(shard: faiss.Index, nprobe: int | None) -> None:
    """The IVF search knob (lists scanned per query); other shard kinds have none."""
    if nprobe is not None and isinstance(shard, faiss.IndexIVF):
        shard.nprobe = int(nprobe)


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
    def empty(cls, dim: int, bounds: Sequence[int], index_type: str = "sq_fp16", sample: np.ndarray | None = None,
              nlist: int | None = None) -> "ShardedIndex":
        """Shards to be filled in row order with ``add`` (streaming builds); an ``ivf`` index is
        trained once on ``sample`` and every shard starts from a copy of it (the same lists)."""
        template = trained(dim, index_type, sample, nlist)
        shards = [faiss.clone_index(template) for _ in range(len(bounds) - 1)]
        return cls(shards, list(bounds), index_type)

    @classmethod
    def build(cls, vectors: np.ndarray, n_shards: int = 1, index_type: str = "sq_fp16", nlist: int | None = None,
              seed: int = 0, recall_target: float | None = None) -> "ShardedIndex":
        """An index of ``vectors`` in memory. An ``ivf`` index measures its recall as the index
        job's does (:class:`RecallProbe`) and is left at the smallest ``nprobe`` reaching
        ``recall_target`` (default: ``retrieval.recall_target``'s); the record is ``.ivf_recall``."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        sample = None
        if index_type == "ivf":
            nlist = nlist or auto_nlist(len(vectors))
            sample = vectors[sample_rows(len(vectors), train_size(nlist, len(vectors)), seed)]
        index = cls.empty(vectors.shape[1], shard_bounds(len(vectors), n_shards), index_type, sample, nlist)
        index.add(vectors, 0)
        if index_type == "ivf":
            if recall_target is None:
                from canopy_ray.config import RetrievalConfig

                recall_target = RetrievalConfig().recall_target
            rows = RecallProbe.rows_for(len(vectors))
            probe = RecallProbe(rows, vectors[rows], recall_target)
            probe.add(vectors, 0)
            index.ivf_recall = probe.tune(index)
        return index

    def set_nprobe(self, nprobe: int | None) -> "ShardedIndex":
        for shard in self.shards:
            set_nprobe(shard, nprobe)
        return self

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
        todo = [(shard, off) for shard, off in zip(self.shards, self.offsets) if min(k, shard.ntotal) > 0]

        def one(shard_off):
            shard, off = shard_off
            d, i = shard.search(queries, min(k, shard.ntotal))
            return d, np.where(i >= 0, i + off, -1)

        # The shards are searched side by side, each by a thread of its own with its share of
        # FAISS's OpenMP threads (FAISS releases the GIL while it scans): a single query then
        # uses every core, and a batch needs no OpenMP barrier across all cores, whose
        # busy-waiting stalls when other work shares the machine.
        results = list(_pool(len(todo)).map(one, todo)) if len(todo) > 1 else [one(t) for t in todo]
        scores, positions = [r[0] for r in results], [r[1] for r in results]
        if not scores:
            return (np.full((len(queries), k), -np.inf, np.float32), np.full((len(queries), k), -1, np.int64))
        return merge_topk(scores, positions, k)

    def memory_bytes(self) -> int:
        """Bytes of the stored vectors (codes, and ids for ``ivf``): what a process holds in RAM,
        or maps, to search them; counted without serialising (a copy of everything)."""
        return int(sum(code_bytes(s) for s in self.shards))

    def save(self, out_dir: str | Path, prefix: str = "shard") -> list[dict]:
        """Write ``{prefix}-{s:03d}.faiss`` files; return their manifest entries."""
        return [save_shard(shard, Path(out_dir) / shard_file(s, prefix), self.offsets[s])
                for s, shard in enumerate(self.shards)]

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
            flags = MMAP_FLAGS if mmap else 0
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


def shard_file(s: int, prefix: str = "shard") -> str:
    return f"{prefix}-{s:03d}.faiss"


def save_shard(shard: faiss.Index, path: Path, offset: int) -> dict:
    """Write one shard atomically; its manifest entry."""
    with atomic_path(path) as tmp:
        faiss.write_index(shard, str(tmp))
    return {"file": path.name, "offset": int(offset), "count": int(shard.ntotal), "sha256": sha256_file(path)}


class ShardFile:
    """One exact shard (``sq_fp16`` or ``flat``) written to its file as its rows arrive, in
    FAISS's own format (byte for byte what ``faiss.write_index`` writes for the whole shard):
    the empty index's header, the codes appended chunk by chunk, and the row count and code
    length filled in at the end. Building holds one chunk in memory, not the shard."""

    def __init__(self, path: Path, template: faiss.Index):
        if not isinstance(template, faiss.IndexFlatCodes) or template.ntotal:
            raise ValueError("a ShardFile streams the codes of an empty flat-codes index (sq_fp16, flat)")
        self.path, self.template, self.ntotal = Path(path), template, 0
        head = faiss.serialize_index(template).tobytes()
        # the header holds ntotal after the 4-byte type and the 4-byte dimension; the codes'
        # length (bytes; floats for IndexFlat) is the last field before the codes
        if int(np.frombuffer(head[8:16], np.int64)[0]) != 0 or head[-8:] != bytes(8):
            raise ValueError(f"unexpected FAISS header layout for {type(template).__name__}")
        self._unit = 4 if isinstance(template, faiss.IndexFlat) else 1
        self._head = len(head)
        self._ctx = atomic_path(self.path)
        self._file = open(self._ctx.__enter__(), "wb")
        self._file.write(head)

    def add(self, vectors: np.ndarray) -> None:
        self._file.write(self.template.sa_encode(np.ascontiguousarray(vectors, dtype=np.float32)).data)
        self.ntotal += len(vectors)

    def close(self, offset: int) -> dict:
        """Finish the file; its manifest entry."""
        f = self._file
        f.seek(8)
        f.write(np.int64(self.ntotal).tobytes())
        f.seek(self._head - 8)
        f.write(np.uint64(self.ntotal * self.template.code_size // self._unit).tobytes())
        f.close()
        self._ctx.__exit__(None, None, None)
        return {"file": self.path.name, "offset": int(offset), "count": self.ntotal, "sha256": sha256_file(self.path)}


def code_bytes(shard: faiss.Index) -> int:
    if isinstance(shard, faiss.IndexIVF):
        return shard.ntotal * (shard.code_size + 8) + shard.nlist * shard.d * 4  # codes, int64 ids, centroids
    if isinstance(shard, faiss.IndexFlatCodes):
        return shard.ntotal * shard.code_size
    return int(faiss.serialize_index(shard).nbytes)


_POOLS: dict = {}


def _pool(n: int):
    """One thread pool per shard count, made on first use and kept (a search is milliseconds).
    OpenMP's thread count is per calling thread, so each worker takes cores / n of them."""
    from concurrent.futures import ThreadPoolExecutor

    if n not in _POOLS:
        per = max(1, faiss.omp_get_max_threads() // n)
        _POOLS[n] = ThreadPoolExecutor(max_workers=n, thread_name_prefix="shard-search",
                                       initializer=faiss.omp_set_num_threads, initargs=(per,))
    return _POOLS[n]


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
        form = shard if isinstance(shard, faiss.IndexIVF) else gpu_flat(shard)  # FAISS has a GPU IVF-SQ
        moved.append(faiss.index_cpu_to_gpu(resources[g], g, form, options))
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
