"""One Ray Train run of the node encoder f_theta: :func:`train`, its :class:`TrainResult`, and
resuming from the checkpoints Ray Train registered (or, when its record is torn, from the newest
checkpoint that loads).

The verb :mod:`canopy_ray.trainer` (``canopy train``) and the recipe comparison
(:mod:`canopy_ray.train.compare`) both call :func:`train`; it lives here, below both.
"""

from __future__ import annotations

import json
import shutil
import sys
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
    best_step: int | None = None  # the checkpoint chosen on validation gold items (None: off)
    best_qualifies: bool | None = None  # its gold recall >= f0's on every family


def train_loop(config: dict) -> None:
    """One Ray Train worker (``train_loop_per_worker``): LoRA over cached MiniLM states, or
    the full Qwen3-VL recipe."""
    if config.get("encoder") == "qwen3-vl":
        from canopy_ray.train.qwen import QwenWorker as Worker
    else:
        from canopy_ray.train.loop import Worker
    Worker(config).run()


def train(cfg: CanopyConfig, data_dirs: dict[str, str | Path], storage_path: str | Path,
          name: str, out_dir: str | Path | None = None, *, max_steps: int | None = None,
          checkpoint_every: int | None = 100, limit: int | None = None,
          time_budget_s: float | None = None, cache_dir: str | Path | None = None) -> TrainResult:
    """Train on the ``train`` split of the named canonical data directories.

    ``max_steps`` caps the total step count (a short run or a test); ``time_budget_s``
    stops after that many seconds inside training steps (then the final checkpoint);
    ``limit`` keeps only the first ``limit`` instances (``training.subsample`` a seeded
    random sample instead); ``out_dir`` receives the final adapter (PEFT layout).

    Before Ray Train starts, the frozen f0 query vectors and the bottom-layer states of
    every node text (below the ``training.lora_layers`` LoRA layers, ``training.max_length``
    tokens) are computed once and cached in ``storage_path/name``
    (:mod:`canopy_ray.train.prepare`); the workers only run the top layers.

    With ``training.val_items``, every checkpoint is scored on validation gold items and the
    best one by :mod:`canopy_ray.train.validation` (recall kept, then decision accuracy) is
    kept in ``storage_path/name/best``, with ``curve.json``/``curve.png`` beside it; then
    ``out_dir`` receives that adapter rather than the last one.
    """
    from canopy_ray.train.lora import ADAPTER_FILES
    from canopy_ray.train.prepare import prepare

    t0 = time.perf_counter()
    tc = cfg.training
    run_dir = (Path(storage_path) / name).resolve()
    loop_config = {**prepare(cfg, data_dirs, run_dir, limit, cache_dir),
                   "max_steps": max_steps, "checkpoint_every": checkpoint_every,
                   "time_budget_s": time_budget_s, "run_dir": str(run_dir),
                   "resume_from": _resume_fallback(run_dir)}
    result = fit_on_ray(train_loop, loop_config, tc, storage_path, name)
    m = result.metrics or {}
    best = run_dir / "best"
    if loop_config["gold_val"] and (best / ADAPTER_FILES[1]).is_file():
        adapter_dir = _copy_adapter_files(best, out_dir)
    else:
        adapter_dir = _copy_adapter(result.checkpoint, out_dir)
    return TrainResult(adapter_dir, int(m.get("step", 0)),
                       len(loop_config["instances"]), float(m.get("loss", "nan")),
                       float(m.get("train_s", 0.0)), time.perf_counter() - t0,
                       result.checkpoint.path if result.checkpoint else None,
                       int(m.get("start_step", 0)), m.get("val_decision_accuracy"),
                       m.get("best_step"), m.get("best_qualifies"))


def fit_on_ray(loop, loop_config: dict, tc, storage_path: str | Path, name: str):
    """``loop`` on Ray Train's workers (``training.workers``, ``use_gpu``, ``max_failures``), its
    checkpoints under ``storage_path/name`` (the same name resumes); the Result."""
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    if not ray.is_initialized():
        ray.init()
    return TorchTrainer(
        loop, train_loop_config=loop_config,
        scaling_config=ScalingConfig(num_workers=tc.workers, use_gpu=tc.use_gpu),
        run_config=RunConfig(name=name, storage_path=str(Path(storage_path).resolve()),
                             checkpoint_config=CheckpointConfig(num_to_keep=2),
                             failure_config=FailureConfig(max_failures=tc.max_failures))).fit()


RAY_RECORD = "checkpoint_manager_snapshot.json"  # Ray Train's list of a run's checkpoints


def registered_step(run_dir: Path) -> int | None:
    """The step of the newest checkpoint Ray Train has registered for a run (None: none yet, or
    its record unreadable)."""
    try:
        latest = json.loads((Path(run_dir) / RAY_RECORD).read_text())["latest_checkpoint_result"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return latest["metrics"]["step"] if latest else None


def _resume_fallback(run_dir: Path) -> str | None:
    """A checkpoint to resume from when Ray Train's record of the run names none: the newest
    one whose files all load. Ray rewrites that record in place, so a kill during the write
    leaves it torn, and Ray then refuses the run on every restart: a torn record is set aside
    (``.torn``). A kill between a checkpoint's copy and its record leaves a checkpoint with no
    record. The workers take this one only when Ray Train gives them none."""
    from canopy_ray.train.lora import checkpoint_loads

    record = run_dir / RAY_RECORD
    try:
        if json.loads(record.read_text())["latest_checkpoint_result"]:
            return None  # Ray Train resumes from its own record
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError):
        record.replace(record.with_name(RAY_RECORD + ".torn"))
        print(f"{record} was torn; kept as {RAY_RECORD}.torn", file=sys.stderr)
    for d in sorted(run_dir.glob("checkpoint_[0-9]*"), reverse=True):  # Ray names them by time
        if checkpoint_loads(d):  # a kill can also leave the newest half copied
            print(f"resuming from {d}", file=sys.stderr)
            return str(d)
    return None


def _copy_adapter(checkpoint, out_dir: str | Path | None) -> Path | None:
    """The adapter files of the final checkpoint copied to ``out_dir`` (None: no copy)."""
    if checkpoint is None or out_dir is None:
        return None
    with checkpoint.as_directory() as d:
        return _copy_adapter_files(d, out_dir)


def _copy_adapter_files(src: str | Path, out_dir: str | Path | None) -> Path | None:
    from canopy_ray.train.lora import ADAPTER_FILES

    if out_dir is None:
        return None
    adapter_dir = Path(out_dir)
    adapter_dir.mkdir(parents=True, exist_ok=True)
    for f in ADAPTER_FILES:
        shutil.copy2(Path(src) / f, adapter_dir / f)
    return adapter_dir
