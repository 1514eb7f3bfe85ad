"""Short training runs compared on validation: ``python -m canopy_ray.train.compare``.

Each named recipe (training-section overrides) trains the same number of steps, one run
after the other, with the recall-aware validation of :mod:`canopy_ray.train.validation`
every ``--every`` steps; the bottom-layer caches are shared (``<storage>/cache``). After
each run the table (``comparison.md`` + ``comparison.json`` in ``--out``) is rewritten, so
a stopped comparison keeps what it finished. Nothing here looks at the test split.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# The recipes compared (learning rate, LoRA depth, training tokens), all with warm-up and
# linear decay unless they say otherwise; the first three differ in the learning rate only.
RECIPES = {
    "lr5e-5": {"lr": 5e-5},
    "lr1e-4": {"lr": 1e-4},
    "lr3e-4": {"lr": 3e-4},
    "lr3e-4-cos": {"lr": 3e-4, "schedule": "cosine"},
    "lr1e-4-4layers": {"lr": 1e-4, "lora_layers": 4},
    "lr3e-4-4layers": {"lr": 3e-4, "lora_layers": 4},
    "lr3e-4-tok256": {"lr": 3e-4, "max_length": 256},
    "lr1e-3": {"lr": 1e-3},
    "lr3e-4-const": {"lr": 3e-4, "schedule": "constant", "warmup": 0.0},  # the shipped recipe
}
BASE = {"schedule": "linear", "warmup": 0.1, "val_instances": 0}
FAMILIES = ("hotpotqa", "nq", "tatqa")


def row(name: str, overrides: dict, cfg, curve: dict, summary: dict) -> dict:
    """One table row: the recipe, speed, the chosen step and its validation numbers."""
    from canopy_ray.train.validation import best_entry

    entries = curve["curve"]
    best = best_entry(entries, cfg.training.recall_tolerance)
    last = entries[-1]
    tc = cfg.training
    return {"name": name, "overrides": overrides, "lr": tc.lr, "schedule": tc.schedule,
            "warmup": tc.warmup, "lora_layers": tc.lora_layers, "max_length": tc.max_length,
            "steps": summary["steps"], "s_per_step": summary["train_s"] / max(summary["steps"], 1),
            "best_step": best["step"], "qualifies": best["qualifies"],
            "best": best["report"], "last_step": last["step"], "last": last["report"],
            "f0": entries[0]["report"]}


def to_markdown(rows: list[dict]) -> str:
    """Validation table: f0 once, then each recipe at its chosen step (acc. / recall, %)."""
    head = ["recipe", "steps", "s/step", "chosen step", "recall >= f0"] + [
        f"{f} acc. / recall" for f in FAMILIES + ("all",)] + ["all acc. / recall (last step)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cells(rep):
        return [f"{100 * rep[f]['decision_accuracy']:.1f} / {100 * rep[f]['gold_recall']:.1f}"
                if f in rep else "-" for f in FAMILIES + ("all",)]

    if rows:
        lines.append("| f0 | 0 | - | - | - | " + " | ".join(cells(rows[0]["f0"])) + " | - |")
    for r in rows:
        last = r["last"]["all"]
        lines.append("| " + " | ".join(
            [r["name"], str(r["steps"]), f"{r['s_per_step']:.2f}", str(r["best_step"]),
             "yes" if r["qualifies"] else "no"] + cells(r["best"])
            + [f"{100 * last['decision_accuracy']:.1f} / {100 * last['gold_recall']:.1f}"]) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import ray

    from canopy_ray.config import load_config
    from canopy_ray.core.files import write_json, write_text
    from canopy_ray.data.sets import SHARED_SETS, default_shared_root, prepare_shared
    from canopy_ray.train.fit import train

    p = argparse.ArgumentParser(prog="python -m canopy_ray.train.compare", description=__doc__)
    p.add_argument("--config", default="configs/cpu.yaml")
    p.add_argument("--recipes", nargs="+", default=list(RECIPES)[:3], choices=list(RECIPES))
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--every", type=int, default=25)
    p.add_argument("--val-items", type=int, default=100, help="validation gold items per family")
    p.add_argument("--storage", default="runs/train/compare")
    p.add_argument("--work-dir", default="runs/data")
    p.add_argument("--shared-data", default=default_shared_root())
    p.add_argument("--out", default="results/training")
    args = p.parse_args(argv)

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    dirs = prepare_shared(args.shared_data, args.work_dir, list(SHARED_SETS))
    storage, out = Path(args.storage), Path(args.out)
    done_path = out / "comparison.json"
    rows = json.loads(done_path.read_text())["rows"] if done_path.is_file() else []
    done = {r["name"] for r in rows}
    for name in args.recipes:
        if name in done:
            continue
        overrides = {**BASE, "val_items": args.val_items, **RECIPES[name]}
        cfg = load_config(args.config, training=overrides)
        result = train(cfg, dirs, storage, name, storage / name / "adapter", max_steps=args.steps,
                       checkpoint_every=args.every, cache_dir=storage / "cache")
        curve = json.loads((storage / name / "curve.json").read_text())
        summary = {"steps": result.steps, "train_s": result.train_s}
        rows.append(row(name, overrides, cfg, curve, summary))
        write_json(done_path, {"steps": args.steps, "every": args.every,
                               "val_items_per_family": args.val_items, "rows": rows})
        write_text(out / "comparison.md", to_markdown(rows))
        print(to_markdown(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
