"""The ``train`` verb: fit the node encoder f_theta with Ray Train and export its adapter.

    from canopy_ray.config import load_config
    from canopy_ray.trainer import train
    result = train(load_config("configs/cpu.yaml"), {"nq": "data/nq"}, "runs", "minilm-canopy",
                   out_dir="runs/minilm-canopy/adapter")

Re-running with the same ``storage_path`` and ``name`` resumes from the last checkpoint.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from canopy_ray.config import CanopyConfig


@dataclass(frozen=True)
class TrainResult:
    adapter_dir: Path | None
    steps: int
    instances: int
    loss: float
    train_s: float  # seconds inside training steps (summed over resumed runs, rank 0)
    wall_s: float  # this call, end to end (instances, f0 queries, Ray Train)
    checkpoint: str | None
    start_step: int = 0  # the step this call resumed from (0 for a fresh run)
    val_decision_accuracy: float | None = None  # on the validation instances, last checkpoint


def train(cfg: CanopyConfig, data_dirs: dict[str, str | Path], storage_path: str | Path,
          name: str, out_dir: str | Path | None = None, *, max_steps: int | None = None,
          checkpoint_every: int | None = 100, limit: int | None = None,
          time_budget_s: float | None = None) -> TrainResult:
    """Train on the ``train`` split of the named canonical data directories.

    ``max_steps`` caps the total step count (a short run or a test); ``time_budget_s``
    stops after that many seconds inside training steps (then the final checkpoint);
    ``limit`` keeps only the first ``limit`` instances (``training.subsample`` a seeded
    random sample instead); ``out_dir`` receives the final adapter (PEFT layout).

    Before Ray Train starts, the frozen f0 query vectors and the bottom-layer states of
    every node text (below the ``training.lora_layers`` LoRA layers, ``training.max_length``
    tokens) are computed once and cached in ``storage_path/name`` (see
    :mod:`canopy_ray.train.cached`); the workers only run the top layers.
    """
    import numpy as np
    import ray
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from canopy_ray.train.instances import build_instances
    from canopy_ray.train.loop import train_loop

    t0 = time.perf_counter()
    tc = cfg.training
    run_dir = Path(storage_path) / name
    instances = build_instances(data_dirs, "train", cfg.hierarchy.branching)
    if limit:
        instances = instances[:limit]
    if tc.subsample and tc.subsample < len(instances):
        keep = np.sort(np.random.default_rng(tc.seed).permutation(len(instances))[:tc.subsample])
        instances = [instances[k] for k in keep]
    if not instances:
        raise ValueError("no training instances in the given data")
    val = []
    if tc.val_instances != 0:
        val = build_instances(data_dirs, "validation", cfg.hierarchy.branching)
        if tc.val_instances and tc.val_instances < len(val):
            keep = np.sort(np.random.default_rng(tc.seed + 1).permutation(len(val))[:tc.val_instances])
            val = [val[k] for k in keep]
    train_part = _prepared(cfg, instances, run_dir)
    loop_config = {
        "training": tc.model_dump(),
        "encoder_path": cfg.models.encoder_path,
        **train_part,
        "val": _prepared(cfg, val, run_dir) if val else None,
        "max_steps": max_steps,
        "checkpoint_every": checkpoint_every,
        "time_budget_s": time_budget_s,
    }
    if not ray.is_initialized():
        ray.init()
    trainer = TorchTrainer(
        train_loop, train_loop_config=loop_config,
        scaling_config=ScalingConfig(num_workers=tc.workers, use_gpu=tc.use_gpu),
        run_config=RunConfig(name=name, storage_path=str(Path(storage_path).resolve()),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)))
    result = trainer.fit()
    m = result.metrics or {}
    adapter_dir = None
    if result.checkpoint is not None and out_dir is not None:
        adapter_dir = Path(out_dir)
        adapter_dir.mkdir(parents=True, exist_ok=True)
        with result.checkpoint.as_directory() as d:
            for f in ("adapter_config.json", "adapter_model.safetensors"):
                shutil.copy2(Path(d) / f, adapter_dir / f)
    return TrainResult(adapter_dir, int(m.get("step", 0)), len(instances), float(m.get("loss", "nan")),
                       float(m.get("train_s", 0.0)), time.perf_counter() - t0,
                       result.checkpoint.path if result.checkpoint else None,
                       int(m.get("start_step", 0)), m.get("val_decision_accuracy"))


def _prepared(cfg: CanopyConfig, instances, run_dir: Path) -> dict:
    """The loop's view of instances: f0 query vectors, ``(query_row, node_rows, pairs)``
    rows and the paths of the cached bottom-layer states of the distinct node texts."""
    import torch

    from canopy_ray.train.cached import cache_bottom
    from canopy_ray.train.lora import load_base, n_layers

    tc = cfg.training
    queries = sorted({i.query for i in instances})
    q_row = {q: k for k, q in enumerate(queries)}
    texts = sorted({x for i in instances for x in i.texts})
    t_row = {x: k for k, x in enumerate(texts)}
    prev = torch.get_num_threads()
    torch.set_num_threads(tc.threads)
    try:
        q_vecs = _f0_queries(cfg, queries, run_dir)
        tok, base = load_base(cfg.models.encoder_path)
        total = n_layers(base)
        n_bottom = total - min(tc.lora_layers or total, total)
        bottom = cache_bottom(base, tok, texts, n_bottom, tc.max_length, run_dir,
                              tag=str(cfg.models.encoder_path), batch_size=cfg.models.batch_size)
    finally:
        torch.set_num_threads(prev)
    return {"queries": q_vecs, "bottom": tuple(str(Path(p).resolve()) for p in bottom),
            "instances": [(q_row[i.query], tuple(t_row[x] for x in i.texts), i.pairs)
                          for i in instances]}


def _f0_queries(cfg: CanopyConfig, queries: list[str], run_dir: Path):
    """Frozen f0 query vectors, computed once without gradients and kept in the run
    directory, so a resumed run does not encode them again."""
    import hashlib
    import json

    import numpy as np

    from canopy_ray.models.encoder import TextEncoder

    key = hashlib.sha1(json.dumps([cfg.models.encoder_path, cfg.models.max_length, queries])
                       .encode()).hexdigest()[:16]
    path = run_dir / f"f0_queries-{key}.npy"
    if path.is_file():
        return np.load(path)
    f0 = TextEncoder(cfg.models.encoder_path, None, cfg.models.max_length, cfg.models.batch_size)
    vecs = f0.encode_queries(queries)
    run_dir.mkdir(parents=True, exist_ok=True)
    np.save(path, vecs)
    return vecs
