"""Train the node encoder f_theta (LoRA) with Ray Train: ``canopy train``.

    python jobs/train.py --config configs/cpu.yaml --name minilm-canopy
    ray job submit --working-dir . -- python jobs/train.py --config configs/cpu.yaml --name minilm-canopy \\
        --shared-data "$PWD/../shared/data" --work-dir "$PWD/runs/data" --storage "$PWD/runs/train"

With ``--working-dir .`` the job runs in Ray's copy of the project, so its data and output paths
are absolute: a relative one (the defaults are) would point inside that copy, and the job refuses
it, naming it (docs/multi-node.md). Running the same command again resumes from the last
checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout or a job working dir

from canopy_ray.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
