"""The benchmark sets the project trains and evaluates on, as canonical directories.

A canonical directory holds ``corpus.jsonl`` and ``questions.jsonl`` (written by
:func:`canopy_ray.data.convert.convert`). :func:`prepare_shared` converts the raw files of
the shared data root once; :func:`load_dataset` reads a canonical directory back.

The shared data root is ``--shared-data``, else ``$CANOPY_SHARED_DATA``, else
``../shared/data`` beside the working directory (where a checkout of this project finds it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

from canopy_ray.core.items import Item, Question, parse_item, parse_question

# The shared raw files of each set and their converter format, relative to the shared data root.
# HotpotQA's two files share 23 paragraphs, so they are one set: one document-level split.
SHARED_SETS = {
    "hotpotqa": ("hotpotqa", ("hotpotqa/hotpotqa_distractor_dev700.jsonl", "hotpotqa/hotpotqa_train100.json")),
    "nq": ("nq", ("nq/nq_open_oracle_1655.jsonl.gz",)),
    "tatqa": ("tatqa", ("tatqa/tatqa_dev.json",)),
}


def default_shared_root() -> str:
    return os.environ.get("CANOPY_SHARED_DATA") or str(Path("..") / "shared" / "data")


def prepare_shared(shared_root: str | Path, out_root: str | Path,
                   names: Sequence[str] | None = None) -> dict[str, Path]:
    """Convert the shared raw sets into ``out_root/<name>/`` (skipping ones already there)."""
    from canopy_ray.data.convert import convert

    out = {}
    for name in names or SHARED_SETS:
        fmt, rels = SHARED_SETS[name]
        d = Path(out_root) / name
        if not ((d / "corpus.jsonl").is_file() and (d / "questions.jsonl").is_file()):
            convert(fmt, [Path(shared_root) / rel for rel in rels], d)
        out[name] = d
    return out


def load_dataset(data_dir: str | Path) -> tuple[dict[str, Item], list[Question]]:
    """Items by id and questions of a canonical directory."""
    d = Path(data_dir)
    items = {}
    with open(d / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                item = parse_item(json.loads(line))
                items[item.id] = item
    with open(d / "questions.jsonl", encoding="utf-8") as f:
        questions = [parse_question(json.loads(line)) for line in f if line.strip()]
    return items, questions
