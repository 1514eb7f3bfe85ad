"""A tiny randomly initialised BERT (2 layers, 32 dims) with the packaged MiniLM's
tokenizer, written once per session as a model directory, a tiny canonical data set, and
the full-model reference encoder (:func:`encode_full`) the cached path must match."""

from __future__ import annotations

import json
import shutil

import pytest

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory):
    import torch
    from transformers import BertConfig, BertModel

    from canopy_ray.models.encoder import packaged_minilm_dir

    src = packaged_minilm_dir()
    out = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    BertModel(config).save_pretrained(out)
    for f in TOKENIZER_FILES:
        if (src / f).is_file():
            shutil.copy2(src / f, out / f)
    return out


TINY_ITEMS = [
    {"id": "t:a", "modality": "text", "title": "Alpha",
     "sentences": ["Alpha is a river in France.", "It flows north.", "Its length is 120 km.",
                   "Fishing is popular there."]},
    {"id": "t:b", "modality": "text", "title": "Beta",
     "sentences": ["Beta was a painter.", "She was born in Lyon.", "She painted rivers.",
                   "Her best work hangs in Paris.", "She died in 1901.", "Her son was a baker."]},
    {"id": "t:c", "modality": "table", "title": "Gamma prices", "header": ["year", "price"],
     "rows": [["2019", "10"], ["2020", "12"], ["2021", "15"]]},
]


def tiny_items(groups: int = 10) -> list[dict]:
    """The tiny items, one copy per group of questions (its own title, so its own document):
    the document-level split then has documents to send to train, validation and test."""
    return [{**it, "id": f"{it['id']}:{g}", "title": f"{it['title']} {g}"} for g in range(groups) for it in TINY_ITEMS]


def tiny_questions(n: int = 24) -> list[dict]:
    """``n`` questions over :func:`tiny_items`: each group of four asks of one copy."""
    templates = [
        ("How long is the Alpha river?", "t:a", [2]),
        ("Where was Beta born?", "t:b", [1]),
        ("When did Beta die and where is her best work?", "t:b", [3, 4]),
        ("What was the price in 2020?", "t:c", [1]),
    ]
    out = []
    for k in range(n):
        q, item, leaves = templates[k % len(templates)]
        item = f"{item}:{k // len(templates) % 10}"
        out.append({"id": f"q{k}", "question": f"{q} ({k})", "answers": ["x"],
                    "gold": [{"item_id": item, "leaves": leaves}], "candidates": [item]})
    return out


@pytest.fixture()
def tiny_data_dir(tmp_path):
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "corpus.jsonl").write_text("".join(json.dumps(i) + "\n" for i in tiny_items()))
    (d / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in tiny_questions()))
    return d


def encode_full(model, tokenizer, texts, max_length: int):
    """The reference f_theta that the cached path and saved adapters must match: the full
    (PEFT) model's mean-pooled unit vectors, with gradients."""
    from canopy_ray.models.encoder import mean_pool

    batch = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length,
                      return_tensors="pt")
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return mean_pool(out.last_hidden_state, batch["attention_mask"])


def tiny_rows(data_dir, model_dir, n: int = 8):
    """``(texts, f0 query vectors, rows)`` of the first ``n`` tiny instances, each row being
    ``(query_row, node_rows, pairs)`` as the training loop takes them."""
    import torch

    from canopy_ray.models.encoder import TextEncoder
    from canopy_ray.train.instances import build_instances

    insts = build_instances({"tiny": data_dir}, split=None)[:n]
    queries = sorted({i.query for i in insts})
    texts = sorted({t for i in insts for t in i.texts})
    qv = torch.from_numpy(TextEncoder(model_dir).encode_queries(queries))
    rows = [(queries.index(i.query), tuple(texts.index(t) for t in i.texts), i.pairs) for i in insts]
    return texts, qv, rows


def train_then_resume(cfg, data, runs, name, out, first_steps: int, total_steps: int):
    """Train ``first_steps``, then run the same command again to ``total_steps``: the second run
    must resume where the first stopped (checked here) and write its adapter to ``out``."""
    from canopy_ray.trainer import train

    first = train(cfg, data, runs, name, max_steps=first_steps, checkpoint_every=1)
    assert (first.steps, first.start_step) == (first_steps, 0)
    second = train(cfg, data, runs, name, out, max_steps=total_steps, checkpoint_every=1)
    assert (second.steps, second.start_step) == (total_steps, first_steps)
    return first, second
