"""The unified item index (FAISS shards, exact merged top-k) and the cached node embeddings.

- ``manifest``: the on-disk layout and ``manifest.json`` (written and read only there);
- ``ingest``: split, validate and embed corpus items (the per-item work, independent of Ray);
- ``job``: the Ray Data index job (plan, embed, build), resumable;
- ``writer``: ``IndexWriter``, item rows in order -> shards, item table, node store, manifest
  (the job's last step; ``benchmarks/scale.py`` writes synthetic corpora through it);
- ``shards``: ``ShardedIndex`` (``sq_fp16``, ``flat`` or approximate ``ivf`` inner-product
  shards), tested against one ``IndexFlatIP`` (``tests/index/test_shards.py``, ``test_writer.py``);
- ``node_store``: fp16 node vectors keyed by item id, memory-mapped;
- ``reader``: ``load_index(dir)`` opens what the job wrote.
"""

from canopy_ray.index.node_store import NodeStore
from canopy_ray.index.reader import CanopyIndex, load_index, load_shard
from canopy_ray.index.shards import ShardedIndex, merge_topk

__all__ = ["CanopyIndex", "NodeStore", "ShardedIndex", "load_index", "load_shard", "merge_topk"]
