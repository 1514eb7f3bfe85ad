"""f_theta for training: the base encoder with a PEFT LoRA adapter, and its checkpoints.

Target modules (BERT / all-MiniLM-L6-v2): every linear map inside the transformer layers,
i.e. attention ``query``/``key``/``value``, the attention output ``dense`` and the
feed-forward ``intermediate.dense``/``output.dense``. Queries stay on frozen f0, so the
node vectors must move on their own toward or away from fixed query vectors; with mean
pooling every token's final state matters, and adapting the feed-forward maps as well as
attention gives the adapter enough capacity (about 0.33M trainable parameters, 1.5% of
22.7M) at a cost of 1.3 MB on disk. The BERT ``pooler.dense`` is excluded: mean pooling
never uses it (an unused LoRA there would also trip DDP's unused-parameter check).

``lora_model(..., layers=L)`` puts LoRA on the top ``L`` layers only (PEFT
``layers_to_transform``; training.lora_layers, default 2): the bottom layers stay frozen and
their states are cached once (:mod:`canopy_ray.train.cached`).

A checkpoint directory holds the adapter in PEFT layout (``adapter_config.json`` +
``adapter_model.safetensors``, loadable by ``PeftModel.from_pretrained`` and so by
:class:`canopy_ray.models.encoder.TextEncoder`), ``optimizer.pt`` and ``state.json``
(``step`` and accumulated training seconds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

TARGET_MODULES = (r".*encoder\.layer\.\d+\.(attention\.self\.(query|key|value)"
                  r"|attention\.output\.dense|intermediate\.dense|output\.dense)")
# The same modules as name suffixes: PEFT's ``layers_to_transform`` needs a list, not a regex.
TARGET_SUFFIXES = ["query", "key", "value", "attention.output.dense", "intermediate.dense",
                   "output.dense"]
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
BASE_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def load_base(model_dir: str | Path | None = None):
    """(tokenizer, base model) from a local directory; None = the packaged MiniLM."""
    from transformers import AutoModel, AutoTokenizer

    from canopy_ray.models.encoder import packaged_minilm_dir

    model_dir = Path(model_dir) if model_dir else packaged_minilm_dir()
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModel.from_pretrained(model_dir, local_files_only=True)
    return tok, model


def n_layers(model) -> int:
    return int(model.config.num_hidden_layers)


def lora_model(base, rank: int = 8, alpha: int = 16, dropout: float = 0.05,
               layers: int | None = None):
    """The base model wrapped with a fresh LoRA (B = 0, so it starts equal to f0).

    ``layers``: LoRA only on the top ``layers`` transformer layers (PEFT
    ``layers_to_transform``, recorded in ``adapter_config.json``); None or 0 = every layer.
    """
    from peft import LoraConfig, get_peft_model

    for p in base.parameters():
        p.requires_grad_(False)
    total = n_layers(base)
    if layers and layers < total:
        config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout,
                            target_modules=list(TARGET_SUFFIXES), bias="none",
                            layers_to_transform=list(range(total - layers, total)),
                            layers_pattern="layer")
    else:
        config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout,
                            target_modules=TARGET_MODULES, bias="none")
    return get_peft_model(base, config)


def save_adapter(peft_model, out_dir: str | Path) -> Path:
    """Write the adapter in PEFT layout (safetensors); returns the directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out), safe_serialization=True)
    cfg_path = out / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("base_model_name_or_path", "").endswith("/model"):  # the packaged MiniLM's path
        cfg["base_model_name_or_path"] = BASE_MODEL_NAME
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out


def load_adapter_weights(peft_model, adapter_dir: str | Path) -> None:
    """Load ``adapter_model.safetensors`` into a LoRA model built with the same config."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(peft_model, state)
    missing = [k for k in getattr(result, "unexpected_keys", []) if "lora" in k]
    if missing:
        raise ValueError(f"adapter keys not in the model: {missing[:3]}...")


@dataclass
class TrainState:
    step: int = 0
    train_s: float = 0.0


def save_checkpoint(peft_model, optimizer, state: TrainState, out_dir: str | Path) -> Path:
    out = save_adapter(peft_model, out_dir)
    torch.save(optimizer.state_dict(), out / "optimizer.pt")
    (out / "state.json").write_text(json.dumps({"step": state.step, "train_s": state.train_s}) + "\n")
    return out


def checkpoint_loads(ckpt_dir: str | Path) -> bool:
    """Whether every file :func:`save_checkpoint` writes is there and reads whole (a kill can
    leave a checkpoint half copied)."""
    from safetensors import safe_open

    d = Path(ckpt_dir)
    try:
        json.loads((d / "state.json").read_text())["step"]
        json.loads((d / ADAPTER_FILES[0]).read_text())
        with safe_open(str(d / ADAPTER_FILES[1]), "pt") as f:
            [f.get_tensor(k) for k in f.keys()]
        torch.load(d / "optimizer.pt", weights_only=True)
    except Exception:  # noqa: BLE001 - any unreadable file disqualifies the checkpoint
        return False
    return True


def load_checkpoint(peft_model, optimizer, ckpt_dir: str | Path) -> TrainState:
    d = Path(ckpt_dir)
    load_adapter_weights(peft_model, d)
    if optimizer is not None and (d / "optimizer.pt").is_file():
        optimizer.load_state_dict(torch.load(d / "optimizer.pt", weights_only=True))
    s = json.loads((d / "state.json").read_text())
    return TrainState(int(s["step"]), float(s.get("train_s", 0.0)))
