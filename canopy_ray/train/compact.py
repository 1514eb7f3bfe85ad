"""Shrink a LoRA adapter for shipping: each update truncated to its top singular directions, in fp16.

A LoRA update is ``delta W = (alpha / r) B A``. A high-rank adapter (the whole-model f_theta,
rank 384 on 384-wide maps) stores more numbers than the maps it updates, while most of each
update's energy lies in few directions. ``compact`` keeps the best rank-``k`` approximation of
every ``delta W`` (Eckart-Young: its top ``k`` singular triplets) as a PEFT adapter with
``r = lora_alpha = k``, so it loads like any other adapter (merged into the weights at load,
no extra cost at inference). ``energy`` in the summary is the share of each update's squared
Frobenius norm kept, the worst map's and the mean.

    canopy compact SRC OUT --rank 64
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from canopy_ray.train.lora import ADAPTER_FILES


def _scale(cfg: dict) -> float:
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        raise ValueError("adapters with per-module ranks or alphas are not supported")
    r = int(cfg["r"])
    return cfg["lora_alpha"] / (math.sqrt(r) if cfg.get("use_rslora") else r)


def truncate(a: torch.Tensor, b: torch.Tensor, scale: float, rank: int):
    """(A', B', kept energy) with B' A' the best rank-``rank`` approximation of ``scale * B A``."""
    u, s, vh = torch.linalg.svd(scale * b.double() @ a.double(), full_matrices=False)
    k = min(rank, s.numel())
    root = s[:k].sqrt()
    energy = float((s[:k] ** 2).sum() / (s ** 2).sum()) if s.any() else 1.0
    return (root[:, None] * vh[:k]), (u[:, :k] * root), energy


def compact(src: str | Path, out: str | Path, rank: int, dtype: torch.dtype = torch.float16) -> dict:
    """Write the rank-``rank`` adapter of ``src`` to ``out``; returns the summary."""
    from safetensors.torch import load_file, save_file

    src, out = Path(src), Path(out)
    cfg = json.loads((src / ADAPTER_FILES[0]).read_text())
    scale, source_rank = _scale(cfg), int(cfg["r"])
    state = load_file(str(src / ADAPTER_FILES[1]))
    new, energies = {}, []
    for key in sorted(k for k in state if ".lora_A." in k):
        key_b = key.replace(".lora_A.", ".lora_B.")
        a, b, energy = truncate(state[key], state[key_b], scale, rank)
        new[key], new[key_b] = a.to(dtype).contiguous(), b.to(dtype).contiguous()
        energies.append(energy)
    if not energies:
        raise ValueError(f"{src}: no LoRA weights in {ADAPTER_FILES[1]}")
    out.mkdir(parents=True, exist_ok=True)
    save_file(new, str(out / ADAPTER_FILES[1]))
    cfg.update(r=rank, lora_alpha=rank, use_rslora=False)
    (out / ADAPTER_FILES[0]).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    summary = {"source_rank": source_rank, "rank": rank,
               "dtype": str(dtype).removeprefix("torch."), "maps": len(energies),
               "energy_min": round(min(energies), 4), "energy_mean": round(sum(energies) / len(energies), 4),
               "bytes": (out / ADAPTER_FILES[1]).stat().st_size}
    (out / "compact.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="canopy compact", description=__doc__.split("\n\n")[0])
    p.add_argument("src", help="adapter directory (adapter_config.json + adapter_model.safetensors)")
    p.add_argument("out", help="where the compacted adapter goes")
    p.add_argument("--rank", type=int, required=True, help="rank kept per update")
    p.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    print(json.dumps(compact(args.src, args.out, args.rank, getattr(torch, args.dtype)), indent=1))
    return 0
