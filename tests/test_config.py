import json
from pathlib import Path

import pytest

from canopy_ray.config import ConfigError, load_config
from canopy_ray.core.policy import Policy

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
    auto = load_config(refinement={"policy": "canopy margin=auto"}, models={"adapter": str(tmp_path)})
    assert auto.margin == 0.025 and auto.policy == Policy("canopy", margin=0.025)
    assert load_config(refinement={"policy": "canopy margin=0.01"}).margin == 0.01
    assert load_config(models={"adapter": None}).margin == 0.0  # f0: the paper's Algorithm 1
    shipped = load_config()  # the CPU default: the shipped adapter's calibrated margin for Algorithm 1
    assert shipped.margin == json.loads((Path(shipped.models.adapter) / "calibration.json").read_text())["margin"]
    with pytest.raises(ConfigError, match="canopy calibrate"):
        load_config(refinement={"policy": "canopy margin=auto"}, models={"adapter": str(tmp_path / "none")}).policy
    with pytest.raises(ConfigError, match="margin"):
        load_config(refinement={"policy": "canopy margin=-0.1"})


def test_the_policy_is_one_text_in_config_and_value():
    cfg = load_config(refinement={"policy": "hybrid  cutoff=0.8 share=0.40 bm25=0.4"})
    assert cfg.refinement.policy == "hybrid share=0.4 cutoff=0.8 bm25=0.4"  # the canonical text
    assert cfg.policy == Policy.parse(cfg.refinement.policy) and str(cfg.policy) == cfg.refinement.policy
    with pytest.raises(ConfigError, match="models.scorer"):
        load_config(refinement={"policy": "hybrid cross=0.2"})


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
