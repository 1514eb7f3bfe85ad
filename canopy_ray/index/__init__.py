"""The unified item index (FAISS shards, exact merged top-k) and the cached node embeddings.

- ``shards``: ``ShardedIndex`` (``sq_fp16`` or ``flat`` inner-product shards), tested against
  one ``IndexFlatIP`` (``tests/index/test_shards.py``).
- ``node_store``: fp16 node vectors keyed by item id, memory-mapped, with on-the-fly fallback
  (``tests/index/test_node_store.py``).
- ``reader``: ``load_index(dir)`` opens what ``canopy_ray.indexer.run_index`` wrote.
"""

from canopy_ray.index.node_store import NodeStore
from canopy_ray.index.reader import CanopyIndex, load_index
from canopy_ray.index.shards import ShardedIndex, merge_topk

__all__ = ["CanopyIndex", "NodeStore", "ShardedIndex", "load_index", "merge_topk"]
