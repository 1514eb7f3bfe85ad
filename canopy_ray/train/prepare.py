"""What the Ray Train workers get, computed once on the driver before training starts.

:func:`prepare` turns the canonical data directories into the data part of the loop
config (:func:`canopy_ray.trainer.train_loop`):

- the ``train`` instances (the first ``limit``, then ``training.subsample`` seeded random
  ones) and up to ``training.val_instances`` seeded random ``validation`` instances;
- per part, the frozen f0 vectors of its distinct queries and the paths of the cached
  bottom-layer states of its distinct node texts (:mod:`canopy_ray.train.cached`), both
  kept in the run directory, so a resumed run computes neither again;
- the instances as plain rows ``(query_row, node_rows, pairs)`` into those two.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from canopy_ray.config import CanopyConfig
from canopy_ray.core.errors import CanopyError
from canopy_ray.core.files import cached_array
from canopy_ray.models.threads import torch_threads
from canopy_ray.train.instances import Instance, build_instances


def prepare(cfg: CanopyConfig, data_dirs: dict[str, str | Path], run_dir: str | Path,
            limit: int | None = None, cache_dir: str | Path | None = None) -> dict:
    """The loop config's data: ``training``, ``encoder_path``, ``queries``, ``bottom``,
    ``instances`` (the train part), ``val`` (the same keys for validation, or None) and
    ``gold_val`` (:func:`gold_part`, or None). The caches go to
    ``cache_dir`` (default ``run_dir``; runs that share it compute each cache once)."""
    from canopy_ray.train.lora import load_base

    run_dir = Path(cache_dir or run_dir)
    instances = train_instances(cfg, data_dirs, limit)
    val = validation_instances(cfg, data_dirs)
    with torch_threads(cfg.training.threads):
        # Qwen3-VL trains the full model on node texts (canopy_ray.train.qwen): no cached states
        tok, base = (None, None) if is_qwen(cfg) else load_base(cfg.models.encoder_path)
        train_part = loop_part(cfg, instances, run_dir, tok, base)
        val_part = loop_part(cfg, val, run_dir, tok, base) if val else None
        gold_val = gold_part(cfg, data_dirs, run_dir, tok, base)
    return {"training": cfg.training.model_dump(), "encoder_path": cfg.models.encoder_path,
            "encoder": cfg.models.encoder, **train_part, "val": val_part, "gold_val": gold_val}


def is_qwen(cfg: CanopyConfig) -> bool:
    return cfg.models.encoder == "qwen3-vl"


def node_part(cfg: CanopyConfig, texts: list[str], run_dir: Path, tok, base) -> dict:
    """How the workers get node texts: the cached bottom-layer states (MiniLM, at
    ``max_length`` tokens) or, for Qwen3-VL, the texts themselves."""
    from canopy_ray.train.cached import cache_bottom
    from canopy_ray.train.lora import n_layers

    if is_qwen(cfg):
        return {"texts": list(texts)}
    total = n_layers(base)
    n_bottom = total - min(cfg.training.lora_layers or total, total)
    bottom = cache_bottom(base, tok, texts, n_bottom, cfg.training.max_length, run_dir,
                          tag=str(cfg.models.encoder_path), batch_size=cfg.models.batch_size)
    return {"bottom": tuple(str(Path(p).resolve()) for p in bottom)}


def gold_part(cfg, data_dirs: Mapping[str, str | Path], run_dir: Path, tok, base) -> dict | None:
    """The loop's gold validation: f0 query vectors, bottom states of every node text of the
    sampled items at ``models.max_length`` (the inference length) and the item rows."""
    from canopy_ray.eval.refinement import collect
    from canopy_ray.train.validation import gold_rows, sample_gold

    tc = cfg.training
    if tc.val_items == 0:
        return None
    gold = sample_gold(collect(data_dirs, "validation", cfg.hierarchy.branching), tc.val_items,
                       tc.seed + 2)
    if not gold:
        return None
    queries, texts, items = gold_rows(gold)
    # scored at the inference token length (models.max_length), not the training cap
    at_inference = cfg.model_copy(update={"training": tc.model_copy(
        update={"max_length": cfg.models.max_length})})
    return {"queries": f0_queries(cfg, queries, run_dir),
            **node_part(at_inference, texts, run_dir, tok, base), "items": items}


def train_instances(cfg: CanopyConfig, data_dirs: dict[str, str | Path],
                    limit: int | None = None) -> list[Instance]:
    """The ``train`` instances: the first ``limit``, then a seeded ``training.subsample``,
    then each fully-gold one ``training.stop_repeat`` times (only ~6% of the shared sets'
    instances say "stop here"; the rest teach descending)."""
    tc = cfg.training
    instances = build_instances(data_dirs, "train", cfg.hierarchy.branching)
    if limit:
        instances = instances[:limit]
    instances = _sample(instances, tc.subsample, tc.seed)
    instances = [i for i in instances for _ in range(tc.stop_repeat if i.fully_gold else 1)]
    if not instances:
        raise CanopyError("no training instances in the given data")
    return instances


def validation_instances(cfg: CanopyConfig, data_dirs: dict[str, str | Path]) -> list[Instance]:
    """Up to ``training.val_instances`` seeded random ``validation`` instances (0 = none)."""
    tc = cfg.training
    if tc.val_instances == 0:
        return []
    val = build_instances(data_dirs, "validation", cfg.hierarchy.branching)
    return _sample(val, tc.val_instances, tc.seed + 1)


def _sample(instances: list[Instance], n: int | None, seed: int) -> list[Instance]:
    """``n`` seeded random instances in their original order (all when ``n`` is None or larger)."""
    if not n or n >= len(instances):
        return instances
    keep = np.sort(np.random.default_rng(seed).permutation(len(instances))[:n])
    return [instances[k] for k in keep]


def loop_part(cfg: CanopyConfig, instances: Sequence[Instance], run_dir: Path, tok, base) -> dict:
    """The loop's view of instances: f0 query vectors, the resolved paths of the cached
    bottom states and ``(query_row, node_rows, pairs)`` rows into both."""
    queries = sorted({i.query for i in instances})
    q_row = {q: k for k, q in enumerate(queries)}
    texts = sorted({x for i in instances for x in i.texts})
    t_row = {x: k for k, x in enumerate(texts)}
    q_vecs = f0_queries(cfg, queries, run_dir)
    return {"queries": q_vecs, **node_part(cfg, texts, run_dir, tok, base),
            "instances": [(q_row[i.query], tuple(t_row[x] for x in i.texts), i.pairs)
                          for i in instances]}


def f0_queries(cfg: CanopyConfig, queries: list[str], run_dir: Path) -> np.ndarray:
    """Frozen f0 query vectors, computed once without gradients and kept in ``run_dir``."""
    m = cfg.models

    def compute() -> np.ndarray:
        from canopy_ray.models.encoder import TextEncoder, build_encoder

        if is_qwen(cfg):
            return build_encoder(m, adapter=False).encode_queries(queries)
        return TextEncoder(m.encoder_path, None, m.max_length, m.batch_size).encode_queries(queries)

    key = [m.encoder_path, m.max_length, queries] + ([m.encoder] if is_qwen(cfg) else [])
    return cached_array(run_dir, "f0_queries", key, compute)
