"""canopy-ray: CANOPY adaptive-granularity evidence compression for multimodal RAG, on Ray.

    import canopy_ray
    results = canopy_ray.compress("Which planet has 95 moons?", [
        {"id": "p1", "modality": "text", "title": "Saturn", "sentences": ["...", "..."]}])
    for r in results:
        print(r.id, r.kept, r.tokens_before, "->", r.tokens_after, r.evidence.text)
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

from canopy_ray.config import CanopyConfig, load_config
from canopy_ray.core.hierarchy import balanced_tree
from canopy_ray.core.refine import refine

__all__ = ["balanced_tree", "compress", "load_config", "refine"]
__version__ = "0.1.0"


@functools.lru_cache(maxsize=2)
def _compressor(cfg: CanopyConfig):
    from canopy_ray.compressor import Compressor
    from canopy_ray.models.encoder import build_encoder

    return Compressor.from_config(cfg, build_encoder(cfg.models))


def compress(query: str, items: Sequence[Any], *, config: str | CanopyConfig | None = None,
             branching: int | None = None):
    """Compress ``items`` (canonical dicts or typed items) for ``query`` in this process.

    Returns one :class:`canopy_ray.compressor.ItemResult` per item: kept spans, every node's
    score and fate, the evidence and tokens before and after. ``config`` is a YAML path or a
    :class:`CanopyConfig` (default: the CPU defaults); its models load once and are reused.
    """
    from canopy_ray.core.items import parse_item

    cfg = config if isinstance(config, CanopyConfig) else load_config(config)
    parsed = [parse_item(it) if isinstance(it, dict) else it for it in items]
    return _compressor(cfg).compress(query, parsed, branching=branching)
