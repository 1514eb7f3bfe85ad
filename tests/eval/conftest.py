"""Paths of the evaluation tests' tiny question set (the local Ray is the session-wide ``ray_local``),
and an adapter that makes f_theta differ from f0."""

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
