"""Train the node encoder f_theta (LoRA on the packaged MiniLM) with Ray Train.

    python jobs/train.py --config configs/cpu.yaml --name minilm-canopy
    ray job submit --working-dir . -- python jobs/train.py --config configs/cpu.yaml --name minilm-canopy

Trains on the ``train`` split of the shared sets (converted into ``--work-dir`` on first
use). Checkpoints go to ``--storage/--name``; running the same command again resumes
from the last checkpoint. The final adapter (PEFT layout, safetensors) is written to
``--out`` (default ``<storage>/<name>/adapter``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DEFAULT_SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def main(argv=None) -> int:
    from canopy_ray.config import load_config
    from canopy_ray.train.instances import SHARED_SETS, prepare_shared
    from canopy_ray.trainer import train

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/cpu.yaml")
    p.add_argument("--name", default="minilm-canopy", help="run name (same name = resume)")
    p.add_argument("--storage", default="runs/train", help="Ray Train storage path")
    p.add_argument("--out", default=None, help="final adapter directory")
    p.add_argument("--sets", nargs="+", default=list(SHARED_SETS), choices=list(SHARED_SETS))
    p.add_argument("--shared-data", default=str(DEFAULT_SHARED), help="the raw shared data root")
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
    p.add_argument("--address", default=None,
                   help="Ray address; 'local' starts a private local Ray (default: Ray's own choice)")
    args = p.parse_args(argv)
    if args.address:
        import ray

        ray.init(address=args.address, include_dashboard=False,
                 **({"num_cpus": 2} if args.address == "local" else {}))

    overrides = {k: v for k, v in (("lr", args.lr), ("epochs", args.epochs),
                                   ("workers", args.workers), ("lora_layers", args.lora_layers),
                                   ("subsample", args.subsample)) if v is not None}
    cfg = load_config(args.config, training=overrides) if overrides else load_config(args.config)
    out = Path(args.out) if args.out else Path(args.storage) / args.name / "adapter"
    dirs = prepare_shared(args.shared_data, args.work_dir, args.sets)
    result = train(cfg, dirs, args.storage, args.name, out, max_steps=args.max_steps,
                   checkpoint_every=args.checkpoint_every, time_budget_s=args.time_budget_s)
    summary = {"adapter": str(result.adapter_dir), "steps": result.steps,
               "start_step": result.start_step, "instances": result.instances,
               "loss": result.loss, "train_s": round(result.train_s, 1),
               "wall_s": round(result.wall_s, 1),
               "val_decision_accuracy": result.val_decision_accuracy, "training": cfg.training.model_dump()}
    print(json.dumps(summary, indent=1))
    if result.adapter_dir:
        (Path(result.adapter_dir) / "train_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
