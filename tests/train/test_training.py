import numpy as np
import torch

from canopy_ray.core.evidence import Piece
from canopy_ray.models.encoder import TextEncoder
from canopy_ray.train.lora import TARGET_MODULES, load_base, lora_model, save_adapter
from canopy_ray.train.loss import batch_loss
from tests.train.conftest import encode_full, tiny_rows


def test_a_few_steps_reduce_the_loss(tiny_bert_dir, tiny_data_dir):
    texts, qv, rows = tiny_rows(tiny_data_dir, tiny_bert_dir)
    torch.manual_seed(0)
    tok, base = load_base(tiny_bert_dir)
    model = lora_model(base, 8, 16, 0.0)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    losses = []
    for _ in range(6):
        loss = batch_loss(qv, encode_full(model, tok, texts, 64), rows, 20.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]


def test_lora_targets_every_layer_linear_but_not_the_pooler(tiny_bert_dir):
    _, base = load_base(tiny_bert_dir)
    model = lora_model(base)
    lora = {n.split(".lora_A")[0] for n, _ in model.named_parameters() if "lora_A" in n}
    assert len(lora) == 2 * 6  # 2 layers x (q, k, v, attention out, intermediate, output)
    assert not any("pooler" in n for n in lora)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert TARGET_MODULES


def test_zero_initialised_lora_gives_f0_scores(tiny_bert_dir, tmp_path):
    _, base = load_base(tiny_bert_dir)
    save_adapter(lora_model(base), tmp_path / "fresh")
    texts = ["Alpha is a river.", "Beta: She died in 1901. Her son was a baker."]
    f0 = TextEncoder(tiny_bert_dir)
    ft = TextEncoder(tiny_bert_dir, adapter=tmp_path / "fresh")
    q = f0.encode_queries(["Where is Alpha?"])[0]
    pieces = [Piece("", "text", (), t) for t in texts]
    np.testing.assert_allclose(ft.encode_nodes(pieces) @ q, f0.encode_nodes(pieces) @ q, atol=1e-6)


def test_adapter_round_trips_through_safetensors(tiny_bert_dir, tmp_path):
    tok, base = load_base(tiny_bert_dir)
    model = lora_model(base, 8, 16, 0.05)
    torch.manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.add_(0.05 * torch.randn_like(p))
    out = save_adapter(model, tmp_path / "adapter")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {f.name for f in out.iterdir()}
    texts = ["Beta was a painter.", "Gamma prices\nyear | price\n2020 | 12"]
    model.eval()
    with torch.no_grad():
        expected = encode_full(model, tok, texts, 64).numpy()
    loaded = TextEncoder(tiny_bert_dir, adapter=out)
    got = loaded.encode_nodes([Piece("", "text", (), t) for t in texts])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # and the adapter really changes f_theta away from f0
    assert np.abs(got - loaded.encode_queries(texts)).max() > 1e-3
