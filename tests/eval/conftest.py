"""Paths of the evaluation tests' tiny question set (the local Ray is the session-wide ``ray_local``),
its corpus indexed for the open setting, and an adapter that makes f_theta differ from f0."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "eval"
QUESTIONS, CORPUS = FIXTURES / "questions.jsonl", FIXTURES / "corpus.jsonl"


@pytest.fixture(scope="session")
def random_adapter(tmp_path_factory):
    """A LoRA adapter on the packaged MiniLM with random non-zero B (a fresh one has B = 0 and
    equals f0), saved in PEFT layout: node vectors with it differ from f0's."""
    import torch

    from canopy_ray.train.lora import load_base, lora_model, save_adapter

    torch.manual_seed(0)
    model = lora_model(load_base()[1])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    return save_adapter(model, tmp_path_factory.mktemp("random-adapter"))


@pytest.fixture(scope="package")
def tiny_index(ray_local, tmp_path_factory):
    """The tiny corpus indexed by the Ray Data job (one flat shard), for the open setting."""
    from ray import cloudpickle

    from canopy_ray.config import load_config
    from canopy_ray.indexer import run_index
    from tests.eval import scripted

    cloudpickle.register_pickle_by_value(scripted)  # Ray workers need not import tests/
    out = tmp_path_factory.mktemp("index")
    cfg = load_config(None, retrieval={"shards": 1, "index_type": "flat"},
                      index={"actors": 1, "shard_items": 10, "batch_items": 8})
    run_index(cfg, CORPUS, out, progress=False)
    return out
