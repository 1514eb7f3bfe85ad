"""The ``train`` verb: fit the node encoder f_theta with Ray Train and export its adapter.

    from canopy_ray.config import load_config
    from canopy_ray.trainer import train
    result = train(load_config("configs/cpu.yaml"), {"nq": "data/nq"}, "runs", "minilm-canopy",
                   out_dir="runs/minilm-canopy/adapter")

Re-running with the same ``storage_path`` and ``name`` resumes from the last checkpoint.
From the shell, :func:`main` (``canopy train`` and ``jobs/train.py``) trains on the
shared sets and prints a summary.
"""

from __future__ import annotations

import argparse
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
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from canopy_ray.train.lora import ADAPTER_FILES
    from canopy_ray.train.prepare import prepare

    t0 = time.perf_counter()
    tc = cfg.training
    run_dir = (Path(storage_path) / name).resolve()
    loop_config = {**prepare(cfg, data_dirs, run_dir, limit, cache_dir),
                   "max_steps": max_steps, "checkpoint_every": checkpoint_every,
                   "time_budget_s": time_budget_s, "run_dir": str(run_dir),
                   "resume_from": _resume_fallback(run_dir)}
    if not ray.is_initialized():
        ray.init()
    trainer = TorchTrainer(
        train_loop, train_loop_config=loop_config,
        scaling_config=ScalingConfig(num_workers=tc.workers, use_gpu=tc.use_gpu),
        run_config=RunConfig(name=name, storage_path=str(Path(storage_path).resolve()),
                             checkpoint_config=CheckpointConfig(num_to_keep=2),
                             failure_config=FailureConfig(max_failures=tc.max_failures)))
    result = trainer.fit()
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


# ---------------------------------------------------------------- command line

# options that override the training field of the same name
TRAINING_OVERRIDES = ("lr", "epochs", "workers", "lora_layers", "subsample", "schedule", "warmup",
                      "val_items", "patience", "max_length", "stop_repeat")


def build_parser() -> argparse.ArgumentParser:
    from canopy_ray.data.sets import SHARED_SETS, default_shared_root

    p = argparse.ArgumentParser(
        prog="canopy train",
        description="Train the node encoder f_theta (LoRA on the packaged MiniLM) with Ray Train.",
        epilog="Trains on the train split of the shared sets (converted into --work-dir on first "
               "use). Checkpoints go to --storage/--name; the same command again resumes from the "
               "last checkpoint. The final adapter (PEFT layout) is written to --out "
               "(default <storage>/<name>/adapter).")
    p.add_argument("--config", default="configs/cpu.yaml")
    p.add_argument("--name", default="minilm-canopy", help="run name (same name = resume)")
    p.add_argument("--storage", default="runs/train", help="Ray Train storage path")
    p.add_argument("--out", default=None, help="final adapter directory")
    p.add_argument("--sets", nargs="+", default=list(SHARED_SETS), choices=list(SHARED_SETS))
    p.add_argument("--shared-data", default=default_shared_root(), help="the raw shared data root")
    p.add_argument("--work-dir", default="runs/data", help="converted data sets go here")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many steps in all")
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--time-budget-s", type=float, default=None,
                   help="stop after this many seconds inside training steps")
    p.add_argument("--lora-layers", type=int, default=None, help="override training.lora_layers")
    p.add_argument("--subsample", type=int, default=None, help="override training.subsample")
    p.add_argument("--lr", type=float, default=None, help="override training.lr")
    p.add_argument("--epochs", type=int, default=None, help="override training.epochs")
    p.add_argument("--workers", type=int, default=None, help="override training.workers")
    p.add_argument("--schedule", choices=["constant", "linear", "cosine"], default=None,
                   help="override training.schedule")
    p.add_argument("--warmup", type=float, default=None, help="override training.warmup")
    p.add_argument("--val-items", type=int, default=None, help="override training.val_items")
    p.add_argument("--patience", type=int, default=None, help="override training.patience")
    p.add_argument("--max-length", type=int, default=None, help="override training.max_length")
    p.add_argument("--stop-repeat", type=int, default=None, help="override training.stop_repeat")
    p.add_argument("--cache-dir", default=None,
                   help="keep the f0 query and bottom-state caches here (shared between runs; "
                        "default: the run directory)")
    p.add_argument("--address", default=None,
                   help="Ray address; 'local' starts a private local Ray (default: Ray's own choice)")
    return p


def main(argv=None) -> int:
    """Train on the shared sets, print the summary and keep it beside the adapter.

    A bad config or missing data prints ``error: ...`` to stderr and returns 2."""
    from canopy_ray.config import ConfigError, load_config
    from canopy_ray.core.errors import CanopyError  # ConvertError (unreadable raw data) is one
    from canopy_ray.data.sets import prepare_shared

    args = build_parser().parse_args(argv)
    if args.address:
        import ray

        ray.init(address=args.address, include_dashboard=False,
                 **({"num_cpus": 2} if args.address == "local" else {}))
    overrides = {k: getattr(args, k) for k in TRAINING_OVERRIDES if getattr(args, k) is not None}
    out = Path(args.out) if args.out else Path(args.storage) / args.name / "adapter"
    try:
        cfg = load_config(args.config, training=overrides) if overrides else load_config(args.config)
        dirs = prepare_shared(args.shared_data, args.work_dir, args.sets)
        result = train(cfg, dirs, args.storage, args.name, out, max_steps=args.max_steps,
                       checkpoint_every=args.checkpoint_every, time_budget_s=args.time_budget_s,
                       **({"cache_dir": args.cache_dir} if args.cache_dir else {}))
    except (ConfigError, CanopyError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = summarize(result, cfg)
    print(json.dumps(summary, indent=1))
    if result.adapter_dir:
        from canopy_ray.core.files import write_json

        write_json(Path(result.adapter_dir) / "train_summary.json", summary)
    return 0


def summarize(result: TrainResult, cfg: CanopyConfig) -> dict:
    """The run's summary: where the adapter is, steps, loss, times and the training section."""
    return {"adapter": str(result.adapter_dir), "steps": result.steps,
            "start_step": result.start_step, "instances": result.instances,
            "loss": result.loss, "train_s": round(result.train_s, 1),
            "wall_s": round(result.wall_s, 1),
            "val_decision_accuracy": result.val_decision_accuracy,
            "best_step": result.best_step, "best_qualifies": result.best_qualifies,
            "training": cfg.training.model_dump()}
