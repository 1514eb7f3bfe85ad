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
import sys
from pathlib import Path

from canopy_ray.config import CanopyConfig
# the run itself lives in the train package (the recipe comparison calls it too); named here
# for the verb's callers
from canopy_ray.train.fit import RAY_RECORD, TrainResult, registered_step, train, train_loop  # noqa: F401


# ---------------------------------------------------------------- command line

# options that override the training field of the same name
TRAINING_OVERRIDES = ("lr", "epochs", "workers", "lora_layers", "lora_rank", "lora_alpha", "subsample", "schedule",
                      "warmup", "val_items", "patience", "max_length", "stop_repeat")


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
    p.add_argument("--scorer", choices=["lora", "cross"], default="lora",
                   help="lora: f_theta, LoRA on the bi-encoder (the paper's); cross: the cross-encoder node "
                        "scorer (training.cross's recipe; written to <storage>/<name>/scorer, set "
                        "models.scorer to it)")
    p.add_argument("--name", default=None, help="run name (same name = resume; default minilm-canopy, "
                                                "minilm-cross with --scorer cross)")
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
    p.add_argument("--lora-rank", type=int, default=None,
                   help="override training.lora_rank (384, MiniLM's width: a full-rank update of each map)")
    p.add_argument("--lora-alpha", type=int, default=None, help="override training.lora_alpha")
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
    cross = args.scorer == "cross"
    name = args.name or ("minilm-cross" if cross else "minilm-canopy")
    out = Path(args.out) if args.out else Path(args.storage) / name / ("scorer" if cross else "adapter")
    try:
        cfg = load_config(args.config, training=overrides) if overrides else load_config(args.config)
        dirs = prepare_shared(args.shared_data, args.work_dir, args.sets)
        if cross:
            from canopy_ray.train.cross import train_cross

            result = train_cross(cfg, dirs, args.storage, name, out, max_steps=args.max_steps,
                                 checkpoint_every=args.checkpoint_every)
        else:
            result = train(cfg, dirs, args.storage, name, out, max_steps=args.max_steps,
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
