"""Which node encoder made a vector: adapter identities recorded in indexes and caches.

f_theta is a base model plus a LoRA adapter; f0 is the base model alone (``"frozen"``).
Vectors stored at index time or cached online are valid only for the node encoder that made
them, so every store records the ``adapter_id`` beside the base ``model_id``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from canopy_ray.core.files import sha256_file

FROZEN = "frozen"


def adapter_fingerprint(adapter_dir: str | Path) -> str:
    """A short content hash of the adapter weights."""
    return "lora-" + sha256_file(Path(adapter_dir) / "adapter_model.safetensors")[:16]


def adapter_id(adapter_dir: str | Path | None) -> str:
    """The identity of the node encoder with this adapter (``frozen`` without one)."""
    return adapter_fingerprint(adapter_dir) if adapter_dir else FROZEN


def model_id(cfg) -> str:
    """The base model's name as encoders report it (``Encoder.model_id``), from a config."""
    if cfg.models.encoder_path:
        return Path(cfg.models.encoder_path).name
    return {"minilm": "all-MiniLM-L6-v2", "qwen3-vl": "Qwen3-VL-Embedding-2B"}[cfg.models.encoder]


@dataclass(frozen=True)
class EncoderIdentity:
    """What a vector store checks against (``NodeStore.usable_for``), without the model."""

    model_id: str
    adapter_id: str
