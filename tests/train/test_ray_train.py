"""Real Ray Train (local Ray, 1 worker, tiny BERT, tiny data): steps, checkpoints, resume."""

import json

import pytest

from canopy_ray.config import load_config

pytestmark = pytest.mark.integration


def test_gold_validation_keeps_the_best_checkpoint_and_resumes_its_curve(
        ray_local, tiny_bert_dir, tiny_data_dir, tmp_path):
    from canopy_ray.train.lora import ADAPTER_FILES
    from canopy_ray.trainer import train

    cfg = load_config(None, models={"encoder_path": str(tiny_bert_dir), "max_length": 64},
                      training={"workers": 1, "batch_size": 4, "epochs": 3, "lr": 1e-3,
                                "lora_layers": 1, "max_length": 32, "val_instances": 8,
                                "val_items": 10, "schedule": "linear", "warmup": 0.2})
    data = {"tiny": tiny_data_dir}
    first = train(cfg, data, tmp_path / "runs", "g", max_steps=2, checkpoint_every=1)
    run_dir = tmp_path / "runs" / "g"
    curve = json.loads((run_dir / "curve.json").read_text())["curve"]
    assert [e["step"] for e in curve] == [0, 1, 2]  # f0, then every checkpoint
    assert set(curve[0]["report"]) >= {"tiny", "all"}
    assert first.best_step in (1, 2)
    chosen = json.loads((run_dir / "best" / "best.json").read_text())
    assert chosen["step"] == first.best_step
    assert (run_dir / "curve.png").stat().st_size > 0
    second = train(cfg, data, tmp_path / "runs", "g", tmp_path / "adapter", max_steps=3,
                   checkpoint_every=1)
    assert second.start_step == 2 and second.val_decision_accuracy is not None
    curve = json.loads((run_dir / "curve.json").read_text())["curve"]
    assert [e["step"] for e in curve] == [0, 1, 2, 3]
    chosen = json.loads((run_dir / "best" / "best.json").read_text())
    assert chosen["step"] == second.best_step
    for f in ADAPTER_FILES:  # the exported adapter is the chosen one, not the last
        assert (tmp_path / "adapter" / f).read_bytes() == (run_dir / "best" / f).read_bytes()
    cfg_json = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert cfg_json["r"] == 8 and cfg_json["lora_alpha"] == 16
    assert cfg_json["layers_to_transform"] == [1]  # top layer only; the bottom one is cached


def test_patience_stops_a_run_without_better_checkpoints(ray_local, tiny_bert_dir, tiny_data_dir,
                                                         tmp_path):
    from canopy_ray.trainer import train

    # a learning rate too small to change any refinement decision: step 1 stays the best
    cfg = load_config(None, models={"encoder_path": str(tiny_bert_dir), "max_length": 64},
                      training={"workers": 1, "batch_size": 4, "epochs": 3, "lr": 1e-12,
                                "lora_layers": 1, "max_length": 32, "val_instances": 0,
                                "val_items": 10, "patience": 2})
    result = train(cfg, {"tiny": tiny_data_dir}, tmp_path / "runs", "p", max_steps=8,
                   checkpoint_every=1)
    assert (result.steps, result.best_step) == (3, 1)
