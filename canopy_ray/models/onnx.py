"""ONNX Runtime for the MiniLM encoders on CPU: exported once, cached on disk, checked on load.

A torch encoder (f0, or f_theta with its LoRA merged into the weights) is exported with mean
pooling and normalisation inside the graph, so a session maps padded ``input_ids`` and
``attention_mask`` straight to unit vectors. Two forms (``benchmarks/encode_onnx.py`` measures
both against torch):

- ``onnx``: fp32, with ONNX Runtime's BERT fusions (skip-layer-norm, bias-GELU); vectors equal
  torch to float noise.
- ``onnx-int8``: weights of every MatMul quantised to int8 per output channel, activations
  quantised at run time with one scale per batch (``quantize_dynamic``), so a vector moves by up
  to ~0.02 with its batch-mates; cosine to torch >= 0.99.

Neither is the CPU default: with 1 thread on 2 cores fp32 ran at 0.83x torch (2.16x with 2
threads on overloaded cores), int8 at 1.34x but cost 0.7 points of f_theta decision accuracy
on the test split (the issue's bar: < 0.5); ``results/bench/encode_onnx.md``.

The exported file lives in a cache directory under a name keyed by everything it depends on
(model id, SHA-256 of the base weights and of the adapter, form, export version). It is written
atomically beside a manifest holding its own SHA-256; a missing, partial or corrupt file (hash
mismatch, or a session that will not load) is rebuilt from the torch model.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Callable

import numpy as np

from canopy_ray.core.files import atomic_path, digest, sha256_file, write_json

BACKENDS = ("torch", "onnx", "onnx-int8")
EXPORT_VERSION = 1  # bump when the export or quantisation recipe changes: old files are not reused
OPSET = 17


def default_cache_dir() -> Path:
    """``$CANOPY_ONNX_CACHE``, else ``$XDG_CACHE_HOME/canopy-ray/onnx`` (``~/.cache`` by default)."""
    if os.environ.get("CANOPY_ONNX_CACHE"):
        return Path(os.environ["CANOPY_ONNX_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "canopy-ray" / "onnx"


def weights_sha256(model_dir: str | Path) -> str:
    """SHA-256 over a model directory's weight files (safetensors, else any .bin), in name order."""
    d = Path(model_dir)
    files = sorted(d.glob("*.safetensors")) or sorted(d.glob("*.bin"))
    if not files:
        raise FileNotFoundError(f"no weight files in {d}")
    from canopy_ray.core.files import sha256_files

    return sha256_files(files, with_names=True)


def cache_key(model_id: str, base_sha: str, adapter_sha: str | None, backend: str) -> str:
    return digest({"model": model_id, "base": base_sha, "adapter": adapter_sha or "frozen",
                   "backend": backend, "export": EXPORT_VERSION, "opset": OPSET}, 24)


def _pooled(model):
    import torch

    class Pooled(torch.nn.Module):
        """The encoder plus masked mean pooling and L2 normalisation (``encoder.mean_pool``)."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            hidden = self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=-1)

    return Pooled(model).eval()


def export_fp32(model, path: Path, num_heads: int, hidden_size: int) -> None:
    """``model`` (a transformers BERT, no PEFT wrapper) -> an fp32 ONNX file with dynamic batch
    and sequence axes and ONNX Runtime's BERT fusions applied."""
    import torch
    from onnxruntime.transformers.optimizer import optimize_model

    ids = torch.ones(2, 8, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # trace with padding, so no all-ones shortcut drops the mask from the graph
    raw = path.with_name(path.stem + ".raw.onnx")
    try:
        with torch.no_grad():  # the TorchScript exporter: no onnxscript needed, traces the eager model
            torch.onnx.export(_pooled(model), (ids, mask), str(raw),
                              input_names=["input_ids", "attention_mask"], output_names=["vectors"],
                              dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                            "attention_mask": {0: "batch", 1: "seq"},
                                            "vectors": {0: "batch"}},
                              opset_version=OPSET, dynamo=False)
        opt = optimize_model(str(raw), model_type="bert", num_heads=num_heads, hidden_size=hidden_size,
                             opt_level=1)
        opt.save_model_to_file(str(path))
    finally:
        raw.unlink(missing_ok=True)


def quantize_int8(src: Path, dst: Path) -> None:
    """Dynamic int8: MatMul weights per output channel (per-tensor lost ~2x more cosine)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True,
                     op_types_to_quantize=["MatMul"],
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})  # fused ops lack types


def require() -> None:
    """A clear error when the optional ``[onnx]`` extra is not installed."""
    import importlib.util

    missing = [m for m in ("onnxruntime", "onnx") if importlib.util.find_spec(m) is None]
    if missing:
        raise RuntimeError(f"models.backend onnx / onnx-int8 needs {' and '.join(missing)}: "
                           "pip install 'canopy-ray[onnx]' (or use backend torch)")


def session(path: Path, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, threads)
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def cached_session(cache_dir: str | Path, key: str, backend: str, build_fp32: Callable[[Path], None],
                   threads: int):
    """An ONNX Runtime session for ``backend`` (``onnx`` or ``onnx-int8``) from
    ``cache_dir/<key>.onnx``, exported with ``build_fp32(path)`` (and quantised) when the file
    is missing, does not match its manifest's SHA-256, or does not load."""
    if backend not in BACKENDS[1:]:
        raise ValueError(f"not an ONNX backend: {backend!r} (choose from {BACKENDS[1:]})")
    require()
    path = Path(cache_dir) / f"{key}.onnx"
    manifest = path.with_suffix(".json")
    if path.is_file() and manifest.is_file():
        try:
            if json.loads(manifest.read_text())["sha256"] == sha256_file(path):
                return session(path, threads)
        except Exception as e:  # unreadable manifest, or a file ONNX Runtime rejects: rebuild it
            logging.getLogger(__name__).warning("rebuilding ONNX model %s: %s", path, e)
    with atomic_path(path) as tmp:
        if backend == "onnx":
            build_fp32(tmp)
        else:
            fp32 = tmp.with_name(tmp.stem + ".fp32.onnx")
            try:
                build_fp32(fp32)
                quantize_int8(fp32, tmp)
            finally:
                fp32.unlink(missing_ok=True)
        sha = sha256_file(tmp)
    write_json(manifest, {"sha256": sha, "backend": backend, "export_version": EXPORT_VERSION})
    return session(path, threads)


def run_session(sess, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Unit vectors (float32) of one padded batch."""
    return sess.run(None, {"input_ids": ids, "attention_mask": mask})[0].astype(np.float32, copy=False)
