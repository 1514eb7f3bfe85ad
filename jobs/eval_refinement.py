"""Refinement evaluation of f0 vs f_theta on gold items of held-out questions (no LLM): ``canopy eval-refinement``.

    python jobs/eval_refinement.py --config configs/cpu.yaml --split test --out runs/eval-test
    ray job submit --working-dir . -- python jobs/eval_refinement.py --config configs/cpu.yaml --split test \\
        --shared-data "$PWD/../shared/data" --work-dir "$PWD/runs/data" --out "$PWD/runs/eval-test"

The adapter is ``--adapter`` or else the config's ``models.adapter`` (``--frozen`` for f0
only). The shared raw sets (``--shared-data``, default ``$CANOPY_SHARED_DATA`` or
``../shared/data``) are converted into ``--work-dir`` on first use.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout or a job working dir

from canopy_ray.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["eval-refinement", *sys.argv[1:]]))
