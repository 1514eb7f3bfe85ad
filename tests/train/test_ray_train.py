"""Real Ray Train (local Ray, 1 worker, tiny BERT, tiny data): steps, checkpoints, resume."""

import json

import pytest

from canopy_ray.config import load_config

pytestmark = pytest.mark.integration


@pytest.fixture()
def local_ray():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, ignore_reinit_error=True,
             runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    yield
    ray.shutdown()


def test_resume_continues_the_step_count(local_ray, tiny_bert_dir, tiny_data_dir, tmp_path):
    from canopy_ray.trainer import train

    cfg = load_config(None, models={"encoder_path": str(tiny_bert_dir), "max_length": 64},
                      training={"workers": 1, "batch_size": 4, "epochs": 2, "lr": 1e-3,
                                "lora_layers": 1, "max_length": 64, "val_instances": 8})
    data = {"tiny": tiny_data_dir}
    first = train(cfg, data, tmp_path / "runs", "tiny", max_steps=2, checkpoint_every=1)
    assert (first.steps, first.start_step) == (2, 0)
    # a run started again with the same storage path and name resumes from step 2
    second = train(cfg, data, tmp_path / "runs", "tiny", tmp_path / "adapter", max_steps=4,
                   checkpoint_every=1)
    assert (second.steps, second.start_step) == (4, 2)
    cfg_json = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert cfg_json["r"] == 8 and cfg_json["lora_alpha"] == 16
    assert cfg_json["layers_to_transform"] == [1]  # top layer only; the bottom one is cached
    assert second.val_decision_accuracy is not None
    assert (tmp_path / "adapter" / "adapter_model.safetensors").stat().st_size > 0
