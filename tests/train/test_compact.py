import json

import numpy as np
import torch

from canopy_ray.core.evidence import Piece
from canopy_ray.models.encoder import TextEncoder
from canopy_ray.train.compact import compact, truncate
from canopy_ray.train.lora import load_base, lora_model, save_adapter


def test_truncate_keeps_the_best_low_rank_approximation():
    torch.manual_seed(0)
    a, b = torch.randn(6, 10), torch.randn(8, 6)
    delta = 0.5 * b.double() @ a.double()  # as truncate computes it: float32 rounding would differ by ~1e-9
    a2, b2, energy = truncate(a, b, 0.5, 2)
    assert a2.shape == (2, 10) and b2.shape == (8, 2)
    s = torch.linalg.svdvals(delta)
    # Eckart-Young: the error left is exactly the dropped singular values
    assert torch.isclose(torch.linalg.norm(delta - b2 @ a2), s[2:].norm(), atol=1e-9)
    assert abs(energy - float((s[:2] ** 2).sum() / (s ** 2).sum())) < 1e-9
    a6, b6, full = truncate(a, b, 0.5, 6)
    assert torch.allclose(b6 @ a6, delta, atol=1e-9) and abs(full - 1) < 1e-12


def _trained(tiny_bert_dir, tmp_path, rank):
    _, base = load_base(tiny_bert_dir)
    model = lora_model(base, rank, 2 * rank, 0.0)
    torch.manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.add_(0.1 * torch.randn_like(p))
    return save_adapter(model, tmp_path / "src")


def test_a_compacted_adapter_loads_and_encodes_like_its_source(tiny_bert_dir, tmp_path):
    src = _trained(tiny_bert_dir, tmp_path, 8)
    texts = [Piece("", "text", (), t) for t in ("Beta was a painter.", "Alpha is a river in France.")]
    expected = TextEncoder(tiny_bert_dir, adapter=src).encode_nodes(texts)
    # every direction kept: the same f_theta up to fp16 rounding, with PEFT's scale 1
    same = compact(src, tmp_path / "r8", 8)
    cfg = json.loads((tmp_path / "r8" / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"], same["dtype"]) == (8, 8, "float16")
    np.testing.assert_allclose(TextEncoder(tiny_bert_dir, adapter=tmp_path / "r8").encode_nodes(texts),
                               expected, atol=2e-3)
    # fewer directions: smaller, further from the source, and still not f0
    small = compact(src, tmp_path / "r1", 1)
    assert small["bytes"] < same["bytes"] and small["energy_mean"] < 1
    got = TextEncoder(tiny_bert_dir, adapter=tmp_path / "r1")
    assert np.abs(got.encode_nodes(texts) - expected).max() > 2e-3
    assert np.abs(got.encode_nodes(texts) - got.encode_queries([p.text for p in texts])).max() > 1e-3
