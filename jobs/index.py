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

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout or a job working dir

from canopy_ray.config import ConfigError, load_config  # noqa: E402
from canopy_ray.indexer import IndexJobError, format_summary, run_index  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=None, help="YAML config (default: built-in defaults)")
    p.add_argument("--corpus", required=True, help="corpus JSONL / JSONL.gz / parquet, or a directory of them")
    p.add_argument("--out", required=True, help="output directory (index, report, resumable state)")
    p.add_argument("--media-root", default=None, help="base of relative media paths (default: the corpus's dir)")
    p.add_argument("--overwrite", action="store_true", help="discard state from another corpus or settings")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray instance, if one is started")
    p.add_argument("--actors", type=int, default=None, help="override index.actors")
    p.add_argument("--shard-items", type=int, default=None, help="override index.shard_items")
    p.add_argument("--no-progress", action="store_true", help="no Ray Data progress bars")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    overrides = {k: v for k, v in {"actors": args.actors, "shard_items": args.shard_items}.items() if v}
    try:
        cfg = load_config(args.config, **({"index": overrides} if overrides else {}))
        summary = run_index(cfg, args.corpus, args.out, media_root=args.media_root, overwrite=args.overwrite,
                            progress=not args.no_progress, num_cpus=args.num_cpus)
    except (ConfigError, IndexJobError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
