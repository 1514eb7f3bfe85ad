"""The packaged MiniLM as f0 and f_theta (PEFT LoRA), and the encoder factory."""

import numpy as np
import pytest

from canopy_ray.config import load_config
from canopy_ray.core.evidence import Piece
from canopy_ray.models.encoder import TextEncoder, build_encoder

TEXTS = ["Paris is the capital of France.", "The Berlin Wall fell in 1989.", "Jupiter has 95 moons."]


def pieces(texts):
    return [Piece(f"i{k}", "text", ((0, 1),), t) for k, t in enumerate(texts)]


@pytest.fixture(scope="module")
def f0():
    return TextEncoder()


def lora_dir(tmp_path, perturb: bool):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel

    from canopy_ray.models.encoder import packaged_minilm_dir

    model = get_peft_model(AutoModel.from_pretrained(packaged_minilm_dir(), local_files_only=True),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"]))
    if perturb:  # a trained adapter: B no longer zero
        import torch

        torch.manual_seed(0)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.data.normal_(0, 0.05)
    out = tmp_path / ("trained" if perturb else "zero")
    model.save_pretrained(out)
    return out


def test_f0_unit_vectors_384(f0):
    q = f0.encode_queries(TEXTS)
    assert q.shape == (3, 384) and q.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1, atol=1e-5)
    assert f0.model_id == "all-MiniLM-L6-v2" and f0.adapter_id == "frozen"
    np.testing.assert_allclose(f0.encode_items(pieces(TEXTS)), q, atol=1e-6)
    np.testing.assert_allclose(f0.encode_nodes(pieces(TEXTS)), q, atol=1e-6)  # no adapter: f_theta = f0
    assert f0.encode_queries([]).shape == (0, 384)


def test_zero_initialised_lora_f_theta_equals_f0(f0, tmp_path):
    enc = TextEncoder(adapter=lora_dir(tmp_path, perturb=False))
    assert enc.adapter_id.startswith("lora-")
    np.testing.assert_allclose(enc.encode_nodes(pieces(TEXTS)), f0.encode_queries(TEXTS), atol=1e-5)


def test_trained_lora_changes_nodes_only(f0, tmp_path):
    adapter = lora_dir(tmp_path, perturb=True)
    enc = TextEncoder(adapter=adapter)
    ref = f0.encode_queries(TEXTS)
    np.testing.assert_allclose(enc.encode_queries(TEXTS), ref, atol=1e-5)  # f0 stays frozen
    np.testing.assert_allclose(enc.encode_items(pieces(TEXTS)), ref, atol=1e-5)
    assert np.abs(enc.encode_nodes(pieces(TEXTS)) - ref).max() > 1e-3
    # f_theta is served from a merged copy; the unmerged PEFT branches give the same vectors
    assert enc.node_model is not None
    unmerged = TextEncoder(adapter=adapter, merge_adapter=False)
    assert unmerged.node_model is None
    # with a merged f_theta, f0 runs on a plain copy (no PEFT wrappers); the same vectors as above
    assert enc.query_model is not None and unmerged.query_model is None
    np.testing.assert_allclose(enc.encode_nodes(pieces(TEXTS)), unmerged.encode_nodes(pieces(TEXTS)), atol=1e-5)
    np.testing.assert_allclose(unmerged.encode_queries(TEXTS), ref, atol=1e-5)


def test_build_encoder_from_config():
    cfg = load_config(None, models={"batch_size": 2, "max_length": 32, "batch_tokens": 300})
    enc = build_encoder(cfg.models)
    assert isinstance(enc, TextEncoder) and enc.dim == 384 and enc.batch_size == 2 and enc.batch_tokens == 300
    assert build_encoder(load_config(None).models).batch_tokens == 1024  # unset: the encoder's default
    with pytest.raises(ValueError, match="encoder_path"):
        build_encoder(load_config(None, models={"encoder": "qwen3-vl"}).models)


# Texts of very different lengths: one past max_length (truncated), some of a few tokens.
MIXED = ["Short.", " ".join(["The river flows north past the old mill and the stone bridge."] * 40),
         "Jupiter has 95 moons.", "", "Paris is the capital of France, on the Seine, with about two million people.",
         " ".join(["A table row: year 2019, revenue 1,204, cost 987."] * 6), "Yes"]


def test_sorted_token_budget_batches_equal_each_text_alone(tmp_path):
    enc = TextEncoder(adapter=lora_dir(tmp_path, perturb=True), max_length=128, batch_size=3, batch_tokens=200)
    lengths = enc.token_counts(pieces(MIXED))
    batches = enc.batches(lengths)
    assert sorted(i for b in batches for i in b) == list(range(len(MIXED)))  # each text once
    assert len(batches) > 2 and all(len(b) <= 3 and (len(b) == 1 or len(b) * lengths[b[0]] <= 200)
                                    for b in batches)
    assert [lengths[i] for b in batches for i in b] == sorted(lengths, reverse=True)
    for encode, wrap in ((enc.encode_nodes, pieces), (enc.encode_queries, list), (enc.encode_items, pieces)):
        together = encode(wrap(MIXED))
        alone = np.concatenate([encode(wrap([t])) for t in MIXED])
        np.testing.assert_allclose(together, alone, atol=1e-5)  # and in the caller's order
    import torch

    with torch.no_grad():  # the unsorted path: one padded batch in the given order, adapter active
        padded = enc.forward(MIXED).numpy()
    np.testing.assert_allclose(enc.encode_nodes(pieces(MIXED)), padded, atol=1e-5)


def test_token_counts_after_truncation_with_special_tokens(f0):
    counts = f0.token_counts(pieces(MIXED))
    tok = f0.tokenizer
    assert counts[0] == len(tok("Short.")["input_ids"]) == 4  # [CLS] short . [SEP]
    assert counts[1] == f0.max_length == 256  # truncated
    assert counts[3] == 2 and f0.token_counts([]) == []
    from canopy_ray.models.encoder import FrozenNodes

    assert FrozenNodes(f0).token_counts(pieces(MIXED)) == counts


def test_nodes_encoded_then_counted_are_tokenized_once():
    enc = TextEncoder()
    calls, tokenize = [], enc.tokenizer
    enc.tokenizer = lambda texts, **kw: (calls.append(list(texts)), tokenize(texts, **kw))[1]
    enc.encode_nodes(pieces(TEXTS))
    counts = enc.token_counts(pieces(TEXTS))
    assert calls == [TEXTS] and counts == [len(tokenize(t)["input_ids"]) for t in TEXTS]
    other = enc.token_counts(pieces(MIXED))  # other texts: tokenized afresh, not the last call's
    assert calls == [TEXTS, MIXED] and other == [len(ids) for ids in tokenize(MIXED, truncation=True,
                                                                                max_length=256)["input_ids"]]
