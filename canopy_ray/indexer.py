"""The ``index`` verb: corpus -> FAISS shards + cached node embeddings, with Ray Data.

    from canopy_ray.config import load_config
    from canopy_ray.indexer import run_index
    summary = run_index(load_config("configs/cpu.yaml"), "corpus.jsonl", "runs/index")

The job itself is :mod:`canopy_ray.index.job`; ``canopy index`` and ``jobs/index.py`` call
:func:`main`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from canopy_ray.config import ConfigError, load_config
from canopy_ray.index.job import IndexJobError, format_summary, run_index

__all__ = ["build_parser", "main", "run_index"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="canopy index",
                                description="Index a corpus: FAISS shards + cached node embeddings (Ray Data job).")
    p.add_argument("--config", default=None, help="YAML config (default: built-in defaults)")
    p.add_argument("--corpus", required=True, help="corpus JSONL / JSONL.gz / parquet, or a directory of them")
    p.add_argument("--out", required=True, help="output directory (index, report, resumable state)")
    p.add_argument("--media-root", default=None, help="base of relative media paths (default: the corpus's dir)")
    p.add_argument("--overwrite", action="store_true", help="start over when the index was built from another "
                   "corpus path or with other settings (a changed corpus at the same path updates it)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray instance, if one is started")
    p.add_argument("--actors", type=int, default=None, help="override index.actors")
    p.add_argument("--shard-items", type=int, default=None, help="override index.shard_items")
    p.add_argument("--no-progress", action="store_true", help="no Ray Data progress bars")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
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
