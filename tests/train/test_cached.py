"""The cached top-layer path equals the full PEFT model, and its adapter loads in TextEncoder."""

import json

import numpy as np
import torch

from canopy_ray.core.evidence import Piece
from canopy_ray.models.encoder import TextEncoder
from canopy_ray.train.cached import TopEncoder, bottom_states, cache_bottom, encode_rows
from canopy_ray.train.lora import load_base, lora_model, save_adapter
from canopy_ray.train.loop import cached_loss
from tests.train.conftest import encode_full, tiny_rows

TEXTS = ["Beta was a painter.", "Gamma prices\nyear | price\n2020 | 12",
         "Alpha: Alpha is a river in France. It flows north. Its length is 120 km. Fishing is popular."]


def perturbed(tiny_bert_dir, layers):
    tok, base = load_base(tiny_bert_dir)
    model = lora_model(base, 8, 16, 0.05, layers)
    torch.manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.add_(0.1 * torch.randn_like(p))
    return tok, model.eval()


def test_lora_on_the_top_layer_only(tiny_bert_dir):
    _, model = perturbed(tiny_bert_dir, 1)
    lora = {n.split(".lora_A")[0] for n, _ in model.named_parameters() if "lora_A" in n}
    assert len(lora) == 6 and all(".layer.1." in n for n in lora)
    assert model.peft_config["default"].layers_to_transform == [1]


def test_cached_path_equals_the_full_model_and_the_saved_adapter(tiny_bert_dir, tmp_path):
    tok, model = perturbed(tiny_bert_dir, 1)
    states, offsets = bottom_states(model, tok, TEXTS, n_bottom=1, max_length=16, batch_size=2)
    assert offsets[-1] == states.shape[0] and (np.diff(offsets) <= 16).all()
    top = TopEncoder(model, 1)
    with torch.no_grad():
        cached = encode_rows(top, states, offsets, [2, 0, 1]).numpy()
        chunked = encode_rows(top, states, offsets, [2, 0, 1], batch_size=2).numpy()
        full = encode_full(model, tok, [TEXTS[2], TEXTS[0], TEXTS[1]], 16).numpy()
    np.testing.assert_allclose(cached, full, atol=1e-5)
    np.testing.assert_allclose(chunked, full, atol=1e-5)
    # the saved adapter is a standard PEFT adapter that TextEncoder loads unchanged
    out = save_adapter(model, tmp_path / "adapter")
    assert json.loads((out / "adapter_config.json").read_text())["layers_to_transform"] == [1]
    enc = TextEncoder(tiny_bert_dir, adapter=out, max_length=16)
    got = enc.encode_nodes([Piece("", "text", (), t) for t in (TEXTS[2], TEXTS[0], TEXTS[1])])
    np.testing.assert_allclose(got, full, atol=1e-5)
    assert np.abs(got - enc.encode_queries([TEXTS[2], TEXTS[0], TEXTS[1]])).max() > 1e-3


def test_chunked_training_forward_gives_the_same_vectors_and_gradients(tiny_bert_dir):
    tok, model = perturbed(tiny_bert_dir, 1)
    states, offsets = bottom_states(model, tok, TEXTS, n_bottom=1, max_length=16)
    top = TopEncoder(model, 1)
    rows = [2, 0, 1, 0]
    grads = []
    for batch_size in (0, 2):
        model.zero_grad()
        vecs = encode_rows(top, states, offsets, rows, batch_size)
        (vecs * torch.arange(1.0, vecs.shape[1] + 1)).sum().backward()
        grads.append((vecs.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]))
    torch.testing.assert_close(grads[0][0], grads[1][0], atol=1e-5, rtol=1e-4)
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_cache_files_are_reused(tiny_bert_dir, tmp_path):
    tok, base = load_base(tiny_bert_dir)
    a = cache_bottom(base, tok, TEXTS, 1, 16, tmp_path, tag="tiny")
    mtime = a[0].stat().st_mtime_ns
    assert cache_bottom(base, tok, TEXTS, 1, 16, tmp_path, tag="tiny") == a
    assert a[0].stat().st_mtime_ns == mtime


def test_a_few_cached_steps_reduce_the_loss(tiny_bert_dir, tiny_data_dir):
    texts, qv, rows = tiny_rows(tiny_data_dir, tiny_bert_dir)
    torch.manual_seed(0)
    tok, base = load_base(tiny_bert_dir)
    model = lora_model(base, 8, 16, 0.0, 1)
    states, offsets = bottom_states(model, tok, texts, 1, 64)
    top = TopEncoder(model, 1)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(6):
        loss = cached_loss(top, states, offsets, qv, rows, list(range(len(rows))), 20.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]
