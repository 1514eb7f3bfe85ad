"""A cross-encoder node scorer: s(q, v) read from the question and the node's text together.

MiniLM (the packaged all-MiniLM-L6-v2 weights) reads ``[CLS] question [SEP] node text [SEP]``
and a linear head on the [CLS] state gives one logit. A bi-encoder's cosine barely moves with
a span's length, so a parent ties its best child; a cross-encoder trained on CANOPY's
preference pairs and on each node's gold overlap (:mod:`canopy_ray.train.cross`) reads the
question with each node, so a node and its children are scored on one scale (measured in
``docs/training.md``). It scores per question: there are no index-time node vectors.

Saved as ``scorer.safetensors`` (the fine-tuned top layers and the head) and ``scorer.json``
(which layers, the base model).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from canopy_ray.core.files import sha256_file
from canopy_ray.models.batching import length_batches


class CrossScored:
    """f_theta with a cross-encoder beside it (``models.scorer``): vectors and identity are the
    wrapped encoder's; :meth:`score_nodes` scores (question, node) pairs, the term
    ``refinement.cross`` weighs."""

    def __init__(self, encoder, scorer: "CrossScorer"):
        self.inner, self.scorer = encoder, scorer
        self.dim, self.model_id, self.adapter_id = encoder.dim, encoder.model_id, encoder.adapter_id

    def encode_queries(self, texts):
        return self.inner.encode_queries(texts)

    def encode_items(self, items):
        return self.inner.encode_items(items)

    def encode_nodes(self, nodes):
        return self.inner.encode_nodes(nodes)

    def token_counts(self, pieces):
        return self.inner.token_counts(pieces)

    def score_nodes(self, query: str, pieces) -> np.ndarray:
        """The cross-encoder's scores of the pieces against the question."""
        return self.scorer.score(query, [p.text for p in pieces])


class CrossScorer(torch.nn.Module):
    """MiniLM over (question, node) pairs with a one-logit head; the top ``tuned_layers``
    layers and the head are what training changes and what :meth:`save` writes."""

    def __init__(self, path: str | Path | None = None, base_dir: str | Path | None = None,
                 tuned_layers: int = 3, max_length: int = 256, batch_tokens: int = 2048,
                 device: str = "cpu"):
        super().__init__()
        from transformers import AutoModel, AutoTokenizer

        from canopy_ray.models.packaged import packaged_minilm_dir

        meta = json.loads((Path(path) / "scorer.json").read_text()) if path else {}
        self.tuned_layers = int(meta.get("tuned_layers", tuned_layers))
        base = Path(base_dir) if base_dir else packaged_minilm_dir()
        self.tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
        self.bert = AutoModel.from_pretrained(base, local_files_only=True)
        self.head = torch.nn.Linear(self.bert.config.hidden_size, 1)
        if path:
            from safetensors.torch import load_file

            missing = set(self.tuned_state()) - set(state := load_file(str(Path(path) / "scorer.safetensors")))
            if missing:
                raise ValueError(f"{path}: scorer.safetensors lacks {sorted(missing)[:3]}")
            self.load_state_dict(state, strict=False)
        for name, p in self.named_parameters():
            p.requires_grad = name in self.tuned_state()
        self.max_length, self.batch_tokens, self.device = max_length, batch_tokens, device
        # by content, as an adapter's: a retrained scorer at the same path never hits a stale cache
        self.adapter_id = f"cross:{sha256_file(Path(path) / 'scorer.safetensors')[:16]}" if path else "cross:untrained"
        self.to(device).eval()

    def tuned_state(self) -> dict[str, torch.Tensor]:
        n = self.bert.config.num_hidden_layers
        top = tuple(f"bert.encoder.layer.{i}." for i in range(n - self.tuned_layers, n))
        return {k: v for k, v in self.state_dict().items() if k.startswith(top + ("head.",))}

    def save(self, path: str | Path, dtype: torch.dtype = torch.float32) -> Path:
        """The tuned layers and head (``dtype``: float16 halves a shipped copy; loading casts back)."""
        from safetensors.torch import save_file

        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().to(dtype).contiguous().cpu() for k, v in self.tuned_state().items()},
                  str(out / "scorer.safetensors"))
        (out / "scorer.json").write_text(json.dumps({"kind": "cross", "base": "all-MiniLM-L6-v2",
                                                     "tuned_layers": self.tuned_layers}, indent=1))
        return out

    def pair_rows(self, query: str, texts: Sequence[str]) -> list[list[int]]:
        """Token rows ``[CLS] question [SEP] text [SEP]``, the text cut to fit ``max_length``."""
        # a long question leaves the node most of the window
        q = self.tokenizer(query, add_special_tokens=False, truncation=True, max_length=self.max_length // 4)["input_ids"]
        room = self.max_length - len(q) - 3
        rows = self.tokenizer(list(texts), add_special_tokens=False, truncation=True, max_length=room)["input_ids"]
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        return [[cls, *q, sep, *r, sep] for r in rows]

    def logits(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """One logit per token row (padded here), with gradients when training."""
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.tensor([list(r) + [pad] * (width - len(r)) for r in rows], device=self.device)
        mask = (torch.arange(width, device=self.device)[None] < torch.tensor([len(r) for r in rows],
                                                                               device=self.device)[:, None])
        segment = torch.zeros_like(ids)
        for k, r in enumerate(rows):  # the node's tokens are segment 1, as BERT read pairs
            segment[k, r.index(self.tokenizer.sep_token_id) + 1: len(r)] = 1
        hidden = self.bert(input_ids=ids, attention_mask=mask.long(), token_type_ids=segment).last_hidden_state
        return self.head(hidden[:, 0]).squeeze(-1)

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """s(q, v) in [0, 1] for each text (the sigmoid of its logit: how much of the node the
        scorer takes for gold), in the given order (length-sorted batches)."""
        return self.score_rows(self.pair_rows(query, texts))

    @torch.inference_mode()
    def score_rows(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        out = np.empty(len(rows), np.float32)
        for batch in length_batches([len(r) for r in rows], 256, self.batch_tokens):
            out[batch] = torch.sigmoid(self.logits([rows[i] for i in batch])).float().cpu().numpy()
        return out
