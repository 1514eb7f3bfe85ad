import json
from pathlib import Path

import pytest

from canopy_ray.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_are_the_papers_numbers():
    cfg = load_config()
    assert (cfg.retrieval.k, cfg.hierarchy.branching, cfg.critic.rounds) == (10, 2, 3)
    assert cfg.hierarchy.segment_s == 30 and cfg.hierarchy.frame_every_s == 10 and cfg.hierarchy.max_frames == 32
    assert cfg.critic.reader_token_cap == 16384
    t = cfg.training
    assert (t.lora_rank, t.lora_alpha, t.lora_dropout, t.lr, t.batch_size, t.epochs, t.temperature,
            t.schedule, t.stop_repeat) == (8, 16, 0.05, 5e-5, 16, 2, 20, "constant", 1)


def test_the_built_in_defaults_are_the_cpu_config_with_the_shipped_adapter():
    # one default: what canopy_ray.compress(), the adapters and the CLI get without a config
    # is what the served app and the evaluation load from configs/cpu.yaml
    cfg = load_config()
    cpu = load_config(ROOT / "configs" / "cpu.yaml")
    assert cfg.model_dump(exclude={"training"}) == cpu.model_dump(exclude={"training"})
    assert cpu.training.stop_repeat == 8  # the shipped adapter's recipe; the defaults are the paper's
    assert cfg.models.adapter and Path(cfg.models.adapter, "adapter_model.safetensors").is_file()
    assert load_config(models={"adapter": None}).models.adapter is None
    assert load_config(models={"encoder": "qwen3-vl"}).models.adapter is None  # no shipped Qwen adapter


def test_margin_auto_reads_the_adapters_calibration(tmp_path):
    (tmp_path / "calibration.json").write_text('{"margin": 0.025}')
    assert load_config(refinement={"margin": "auto"}, models={"adapter": str(tmp_path)}).margin == 0.025
    assert load_config(refinement={"margin": 0.01}).margin == 0.01
    assert load_config(models={"adapter": None}).margin == 0.0  # f0: the paper's Algorithm 1
    shipped = load_config()  # the CPU default: the shipped adapter's calibrated margin
    assert shipped.refinement.margin == "auto" and shipped.margin == json.loads(
        (Path(shipped.models.adapter) / "calibration.json").read_text())["margin"]
    with pytest.raises(ConfigError, match="canopy calibrate"):
        load_config(refinement={"margin": "auto"}, models={"adapter": str(tmp_path / "none")}).margin
    with pytest.raises(ConfigError, match="margin"):
        load_config(refinement={"margin": -0.1})


# serve*.yaml are Ray Serve configs, sweep*.yaml sweep specs; the rest are CanopyConfig files
CANOPY_CONFIGS = [p for p in sorted((ROOT / "configs").glob("*.yaml"))
                  if not p.name.startswith(("serve", "sweep"))]


@pytest.mark.parametrize("path", CANOPY_CONFIGS, ids=lambda p: p.name)
def test_committed_configs_load(path):
    load_config(path)


def test_unknown_keys_are_named(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("retrieval:\n  kk: 3\n")
    with pytest.raises(ConfigError, match="retrieval.kk"):
        load_config(p)


def test_bad_values_are_named(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("hierarchy:\n  branching: 1\n")
    with pytest.raises(ConfigError, match="hierarchy.branching"):
        load_config(p)


def test_overrides_merge_into_sections(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("retrieval:\n  k: 5\n")
    cfg = load_config(p, retrieval={"shards": 3})
    assert (cfg.retrieval.k, cfg.retrieval.shards) == (5, 3)


def test_unreadable_or_non_mapping_files(tmp_path):
    with pytest.raises(ConfigError):
        load_config(tmp_path / "missing.yaml")
    p = tmp_path / "c.yaml"
    p.write_text("- 1\n")
    with pytest.raises(ConfigError):
        load_config(p)


def test_portable_path_undoes_resolve_path():
    from canopy_ray.config import MINILM_ADAPTER, portable_path, resolve_path

    assert portable_path(resolve_path(MINILM_ADAPTER)) == MINILM_ADAPTER
    assert portable_path("/elsewhere/adapter") == "/elsewhere/adapter" and portable_path(None) is None
