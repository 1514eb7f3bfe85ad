"""Refinement evaluation of f0 vs f_theta on gold items of held-out questions (no LLM).

    python jobs/eval_refinement.py --config configs/cpu.yaml --split test --out runs/eval-test
    ray job submit --working-dir . -- python jobs/eval_refinement.py --config configs/cpu.yaml

The adapter is ``--adapter`` or else the config's ``models.adapter`` (``--frozen`` for f0
only). The shared raw sets are converted into ``--work-dir`` on first use.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def main(argv=None) -> int:
    from canopy_ray.config import load_config, resolve_path
    from canopy_ray.eval.refinement import run, to_markdown
    from canopy_ray.train.instances import SHARED_SETS, prepare_shared

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/cpu.yaml")
    p.add_argument("--split", default="test", choices=["train", "validation", "test", "all"])
    p.add_argument("--sets", nargs="+", default=list(SHARED_SETS), choices=list(SHARED_SETS))
    p.add_argument("--shared-data", default=str(DEFAULT_SHARED), help="the raw shared data root")
    p.add_argument("--work-dir", default="runs/data", help="converted data sets go here")
    p.add_argument("--adapter", default=None, help="f_theta adapter dir (default: config's)")
    p.add_argument("--frozen", action="store_true", help="evaluate f0 only")
    p.add_argument("--out", default="runs/eval-refinement")
    p.add_argument("--cache", default=None, help="cache query/node vectors here (per encoder)")
    args = p.parse_args(argv)

    cfg = load_config(args.config)
    adapter = None if args.frozen else (args.adapter or resolve_path(cfg.models.adapter))
    dirs = prepare_shared(args.shared_data, args.work_dir, args.sets)
    report = run(cfg, dirs, None if args.split == "all" else args.split, args.out, adapter,
                 args.cache)
    print(to_markdown(report))
    print(f"wrote {args.out}/refinement.md, refinement.json, refinement_by_depth.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
