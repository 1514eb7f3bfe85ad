"""Index a corpus: FAISS shards + cached node embeddings (``canopy_ray.indexer.run_index``).

Directly (starts a local Ray instance, stopped at the end):

    python jobs/index.py --config configs/cpu.yaml --corpus corpus.jsonl --out runs/index

On a running cluster with ``ray job submit``. Ray 2.60 turns token authentication on by
default (``RAY_AUTH_MODE=token``): ``ray start --head`` generates a token in
``~/.ray/auth_token`` and ``ray job submit`` on the same machine reads it from there;
elsewhere, set ``RAY_AUTH_TOKEN`` (or ``RAY_AUTH_TOKEN_PATH``) to the head's token. On a
trusted single-user machine, set ``RAY_AUTH_MODE=disabled`` for both commands instead.

    ray start --head --num-cpus 2
    ray job submit --working-dir . -- python jobs/index.py \\
        --config configs/cpu.yaml --corpus /abs/path/corpus.jsonl --out /abs/path/runs/index
    ray stop

(With ``--working-dir .`` the job runs in a copy of the project, so give absolute paths.)
Killed and rerun with the same arguments, the job resumes from its finished input shards.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout or a job working dir

from canopy_ray.indexer import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
