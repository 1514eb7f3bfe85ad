"""Sweep over k and B plus the method ablation, on Ray, resumable; writes points, table, plots.

    python jobs/sweep.py --spec configs/sweep.yaml --out results/sweep
    ray job submit --working-dir . -- python jobs/sweep.py --spec configs/sweep.yaml --out results/sweep

Finished points (``OUT/points/...json``) are skipped on a rerun. Without ``--address`` (or
``RAY_ADDRESS``) a local Ray instance with ``--num-cpus`` CPUs (default: the pool's) is started
and stopped at the end.
"""

from __future__ import annotations

import sys

from canopy_ray.eval.sweep import build_parser, main  # noqa: F401  (the parser is shared with ``canopy sweep``)

if __name__ == "__main__":
    sys.exit(main())
