"""Evaluate methods over a questions file (given or open setting) and write run JSONs.

    python jobs/eval.py --config configs/cpu.yaml --questions questions.jsonl --corpus corpus.jsonl \\
        --setting given --method canopy --out run.json
    python jobs/eval.py --questions q.jsonl --corpus c.jsonl --method all --n 40 --out runs/eval
    python jobs/eval.py --questions q.jsonl --setting open --index runs/index --method canopy,vanilla --out runs/eval
    ray job submit --working-dir . -- python jobs/eval.py --questions "$PWD/q.jsonl" --corpus "$PWD/c.jsonl" \\
        --out "$PWD/runs/eval"  # absolute: the job runs in Ray's copy of the project

Methods: canopy, vanilla, no_projection, no_iteration, flat, frozen (or ``all``). Each run holds
per-question records and an ``aggregate`` of every metric with its 95% bootstrap interval;
several methods with canopy among them also give ``comparison.json`` (paired differences).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout or a job working dir

from canopy_ray.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["eval", *sys.argv[1:]]))
