"""Index a corpus: FAISS shards + cached node embeddings (``canopy index``, :mod:`canopy_ray.index.job`).

    python jobs/index.py --config configs/cpu.yaml --corpus corpus.jsonl --out runs/index
    ray job submit --working-dir . -- python jobs/index.py --config configs/cpu.yaml \\
        --corpus "$PWD/corpus.jsonl" --out "$PWD/runs/index"

With ``--working-dir .`` the job runs in Ray's copy of the project: a relative ``--corpus`` or
``--out`` would point inside that copy, so the job refuses it, naming it (docs/multi-node.md has
the cluster's commands and how ``ray job submit`` authenticates). Killed and rerun with the same
arguments, the job resumes from its finished input shards.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout or a job working dir

from canopy_ray.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["index", *sys.argv[1:]]))
