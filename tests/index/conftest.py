"""One index of the fixture corpus, built once per session by the real job (local Ray, the
packaged MiniLM), for the job's tests and the corrupt-state tests (which damage copies)."""

from pathlib import Path

import pytest

from canopy_ray.config import load_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "index"
CORPUS = FIXTURES / "corpus.jsonl"


def index_config(**index):
    return load_config(None, models={"adapter": None}, retrieval={"shards": 3, "index_type": "sq_fp16"},
                       index={"actors": 1, "shard_items": 4, "batch_items": 4, **index})


@pytest.fixture(scope="session")
def built_index(ray_local, tmp_path_factory):
    """``(out_dir, summary)`` of an uninterrupted run; tests must not change its files."""
    from canopy_ray.indexer import run_index

    out = tmp_path_factory.mktemp("built-index")
    return out, run_index(index_config(), CORPUS, out, progress=False)
