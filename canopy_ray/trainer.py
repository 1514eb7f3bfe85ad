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


def train(cfg: CanopyConfig, data_dirs: dict[str, str | Path], storage_path: str | Path,
          name: str, out_dir: str | Path | None = None, *, max_steps: int | None = None,
          checkpoint_every: int | None = 100, limit: int | None = None) -> TrainResult:
    """Train on the ``train`` split of the named canonical data directories.

    ``max_steps`` caps the total step count (a short run or a test); ``limit`` keeps only
    the first ``limit`` instances; ``out_dir`` receives the final adapter (PEFT layout).
    """
    import ray
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from canopy_ray.train.instances import build_instances
    from canopy_ray.train.loop import train_loop

    t0 = time.perf_counter()
    instances = build_instances(data_dirs, "train", cfg.hierarchy.branching)
    if limit:
        instances = instances[:limit]
    if not instances:
        raise ValueError("no training instances in the given data")
    queries = sorted({i.query for i in instances})
    row = {q: k for k, q in enumerate(queries)}
    q_vecs = _f0_queries(cfg, queries, Path(storage_path) / name)
    loop_config = {
        "training": cfg.training.model_dump(),
        "encoder_path": cfg.models.encoder_path,
        "max_length": cfg.models.max_length,
        "queries": q_vecs,
        "instances": [(row[i.query], i.texts, i.pairs) for i in instances],
        "max_steps": max_steps,
        "checkpoint_every": checkpoint_every,
    }
    if not ray.is_initialized():
        ray.init()
    trainer = TorchTrainer(
        train_loop, train_loop_config=loop_config,
        scaling_config=ScalingConfig(num_workers=cfg.training.workers, use_gpu=cfg.training.use_gpu),
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
                       int(m.get("start_step", 0)))


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
