"""Sweep over k and B plus the method ablation, on Ray, resumable; writes points, table, plots.

    python jobs/sweep.py --spec configs/sweep.yaml --out results/sweep
    ray job submit --working-dir . -- python jobs/sweep.py --spec my-sweep.yaml --out "$PWD/results/sweep"

The job runs in Ray's copy of the project, which is not kept: ``--out`` and the spec's paths
(``work_dir``, each set's ``raw``, ``questions``, ``corpus``, ``index``; configs/sweep.yaml's are
relative to the project) must be absolute there.

Finished points (``OUT/points/...json``) are skipped on a rerun. Without ``--address`` (or
``RAY_ADDRESS``) a local Ray instance with ``--num-cpus`` CPUs (default: the pool's) is started
and stopped at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout or a job working dir

from canopy_ray.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["sweep", *sys.argv[1:]]))
