"""canopy-ray: CANOPY adaptive-granularity evidence compression for multimodal RAG, on Ray.

    import canopy_ray
    results = canopy_ray.compress("Which planet has 95 moons?", [
        {"id": "p1", "modality": "text", "title": "Saturn", "sentences": ["...", "..."]}])
    for r in results:
        print(r.id, r.kept, r.tokens_before, "->", r.tokens_after, r.evidence.text)
    print(canopy_ray.token_report(results))  # origin_tokens, compressed_tokens, ratio

    client = canopy_ray.Client("http://127.0.0.1:8000")  # the same against `canopy serve`
    results = client.compress("Which planet has 95 moons?", items)
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

from canopy_ray.config import CanopyConfig, load_config
from canopy_ray.core.hierarchy import balanced_tree
from canopy_ray.core.refine import refine

__all__ = ["Client", "balanced_tree", "compress", "load_config", "refine", "token_report"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """``Client`` and ``token_report`` load on first use (``import canopy_ray`` stays light)."""
    if name == "Client":
        from canopy_ray.client import Client

        return Client
    if name == "token_report":
        from canopy_ray.compressor import token_report

        return token_report
    raise AttributeError(f"module 'canopy_ray' has no attribute {name!r}")


@functools.lru_cache(maxsize=2)
def _compressor(cfg: CanopyConfig):
    from canopy_ray.compressor import Compressor
    from canopy_ray.models.encoder import build_encoder
    from canopy_ray.models.llm.tokens import token_counter

    return Compressor.from_config(cfg, build_encoder(cfg.models), count_tokens=token_counter(cfg.llm))


def compress(query: str, items: Sequence[Any], *, config: str | CanopyConfig | None = None,
             branching: int | None = None, policy: str | None = None):
    """Compress ``items`` (canonical dicts or typed items) for ``query`` in this process.

    Returns one :class:`canopy_ray.compressor.ItemResult` per item: kept spans, every node's
    score and fate, the evidence and tokens before and after. ``config`` is a YAML path or a
    :class:`CanopyConfig` (default: the CPU defaults, tuned adapter included: the configuration
    the served app and the evaluation use); its models load once and are reused. ``branching``
    overrides the config's B for this call, ``policy`` its ``refinement.policy``
    (:mod:`canopy_ray.core.policy`, e.g. ``"canopy margin=0.05"`` for Algorithm 1).
    """
    from canopy_ray.core.items import parse_item
    from canopy_ray.core.policy import resolved

    cfg = config if isinstance(config, CanopyConfig) else load_config(config)
    parsed = [parse_item(it) if isinstance(it, dict) else it for it in items]
    return _compressor(cfg).compress(query, parsed, branching=branching,
                                   policy=resolved(policy, lambda: cfg.margin) if policy else None)
