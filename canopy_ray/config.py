"""One typed configuration, composed of small sections, loaded from YAML in ``configs/``.

Every section forbids unknown keys, so a typo in a YAML file is an error that names the
key instead of a silently ignored setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RetrievalConfig(Section):
    k: int = Field(10, ge=1, le=1000, description="items retrieved per round")
    shards: int = Field(1, ge=1, description="FAISS shards searched together")
    index_type: Literal["sq_fp16", "flat"] = "sq_fp16"


class HierarchyConfig(Section):
    branching: int = Field(2, ge=2, le=16, description="B: children per internal node")
    segment_s: float = Field(30.0, gt=0, description="video leaf length in seconds")
    frame_every_s: float = Field(10.0, gt=0, description="one video frame per this many seconds")
    max_frames: int = Field(32, ge=1, description="frames per video node at most")


class CriticConfig(Section):
    rounds: int = Field(3, ge=1, le=10, description="R: critic rounds at most")
    reader_token_cap: int = Field(16384, ge=256, description="reader evidence tokens at most")


class ModelsConfig(Section):
    encoder: Literal["minilm", "qwen3-vl"] = "minilm"
    encoder_path: str | None = Field(None, description="model directory; None = the packaged default")
    adapter: str | None = Field(None, description="LoRA adapter directory for f_theta; None = f0")
    max_length: int = Field(256, ge=8, description="encoder input tokens at most")
    batch_size: int = Field(64, ge=1)
    device: str = "cpu"


class TrainingConfig(Section):
    lora_rank: int = Field(8, ge=1)
    lora_alpha: int = Field(16, ge=1)
    lora_dropout: float = Field(0.05, ge=0, lt=1)
    lr: float = Field(5e-5, gt=0)
    batch_size: int = Field(16, ge=1)
    epochs: int = Field(2, ge=1)
    temperature: float = Field(20.0, gt=0, description="lambda of the pairwise loss")
    workers: int = Field(1, ge=1)
    use_gpu: bool = False
    seed: int = 0


class CanopyConfig(Section):
    retrieval: RetrievalConfig = RetrievalConfig()
    hierarchy: HierarchyConfig = HierarchyConfig()
    critic: CriticConfig = CriticConfig()
    models: ModelsConfig = ModelsConfig()
    training: TrainingConfig = TrainingConfig()


class ConfigError(ValueError):
    pass


def load_config(path: str | Path | None = None, **overrides) -> CanopyConfig:
    """Load a YAML config (or the defaults), with ``section={key: value}`` overrides."""
    data: dict = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"cannot read config {path}: {e}") from e
        if not isinstance(data, dict):
            raise ConfigError(f"config {path} must be a mapping of sections")
    for section, values in overrides.items():
        data[section] = {**data.get(section, {}), **values}
    try:
        return CanopyConfig.model_validate(data)
    except ValidationError as e:
        lines = [f"  {'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
        raise ConfigError(f"invalid config {path or '(defaults)'}:\n" + "\n".join(lines)) from None
