"""The Qwen3-VL-Embedding training path end to end on a tiny random Qwen3-VL (CPU, fp32):
LoRA on the language model only, the loss falls, a Ray Train run resumes, and the saved
adapter loads for inference and changes node vectors only."""

import json

import numpy as np
import pytest
import torch

from canopy_ray.config import load_config
from canopy_ray.core.evidence import Piece
from canopy_ray.models.qwen3vl import Qwen3VLEncoder, build_tiny_qwen3vl
from canopy_ray.train.qwen import LastTokenNodes, enable_checkpointing, qwen_lora
from tests.train.conftest import train_then_resume

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    return build_tiny_qwen3vl(tmp_path_factory.mktemp("tiny-qwen3vl-train"))


def test_lora_on_the_language_model_only_and_the_loss_falls(tiny_qwen):
    from canopy_ray.train.loss import batch_loss

    torch.manual_seed(0)
    enc = Qwen3VLEncoder(tiny_qwen, device="cpu")
    assert enc.base.dtype == torch.float32  # fp32 on CPU
    model = qwen_lora(enc.base, rank=4, alpha=8, dropout=0.0)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("language_model" in n and "lora_" in n for n in trainable)
    assert not any("visual" in n for n in trainable)
    assert any("mlp.down_proj" in n for n in trainable) and any("self_attn.q_proj" in n for n in trainable)
    enable_checkpointing(enc.base)
    model.train()
    assert enc.base.language_model.gradient_checkpointing
    nodes = LastTokenNodes(enc, model, max_length=48)
    texts = ["Alpha is a river in France.", "Fishing is popular there.",
             "Beta was born in Lyon.", "She died in 1901."]
    q = torch.from_numpy(enc.encode_queries(["Where is the Alpha river?", "Where was Beta born?"]))
    groups = [(0, [0, 1], [(0, 1)]), (1, [2, 3], [(0, 1)])]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    losses = []
    for _ in range(8):
        loss = batch_loss(q, nodes(*nodes.inputs(texts)), groups, 20.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] * 0.8


def test_ray_train_resumes_and_the_adapter_changes_node_vectors_only(
        ray_local, tiny_qwen, tiny_data_dir, tmp_path):
    cfg = load_config(None, models={"encoder": "qwen3-vl", "encoder_path": str(tiny_qwen),
                                    "max_length": 96, "device": "cpu"},
                      training={"workers": 1, "batch_size": 4, "epochs": 2, "lr": 5e-3,
                                "max_length": 64, "val_instances": 0, "val_items": 6,
                                "schedule": "cosine", "warmup": 0.25, "use_gpu": False})
    train_then_resume(cfg, {"tiny": tiny_data_dir}, tmp_path / "runs", "q", tmp_path / "adapter", 2, 3)
    curve = json.loads((tmp_path / "runs" / "q" / "curve.json").read_text())["curve"]
    assert [e["step"] for e in curve] == [0, 1, 2, 3]
    adapter_cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert "language_model" in adapter_cfg["target_modules"]

    f0 = Qwen3VLEncoder(tiny_qwen, device="cpu")
    ft = Qwen3VLEncoder(tiny_qwen, tmp_path / "adapter", device="cpu")
    queries = ["Where was Beta born?"]
    nodes = [Piece("", "text", (), "Beta was born in Lyon."), Piece("", "text", (), "It flows north.")]
    assert np.allclose(f0.encode_queries(queries), ft.encode_queries(queries), atol=1e-5)
    assert np.allclose(f0.encode_items(nodes), ft.encode_items(nodes), atol=1e-5)
    assert not np.allclose(f0.encode_nodes(nodes), ft.encode_nodes(nodes), atol=1e-4)
