"""A kill while Ray Train rewrites its record of a run's checkpoints
(``checkpoint_manager_snapshot.json``, written in place) leaves it torn; Ray alone would then
refuse the run on every restart. The same command must resume from the newest checkpoint whose
files all load (real local Ray, 1 worker, tiny BERT, tiny data)."""

import json
import shutil

import pytest

from canopy_ray.config import load_config

pytestmark = pytest.mark.integration


def test_torn_checkpoint_record_resumes_from_the_newest_whole_checkpoint(ray_local, tiny_bert_dir,
                                                                         tiny_data_dir, tmp_path):
    from canopy_ray.trainer import RAY_RECORD, train

    cfg = load_config(None, models={"encoder_path": str(tiny_bert_dir), "max_length": 64},
                      training={"workers": 1, "batch_size": 4, "epochs": 2, "lr": 1e-3, "lora_layers": 1,
                                "max_length": 64, "val_instances": 0})
    data, runs = {"tiny": tiny_data_dir}, tmp_path / "runs"
    first = train(cfg, data, runs, "torn", max_steps=4, checkpoint_every=2)
    assert first.steps == 4
    run = runs / "torn"
    record = run / RAY_RECORD
    text = record.read_text()
    record.write_text(text[: len(text) // 2])  # as a kill during Ray's write leaves it
    newest = max(run.glob("checkpoint_[0-9]*"))
    assert json.loads((newest / "state.json").read_text())["step"] == 4
    half = run / "checkpoint_9999-12-31_23-59-59.999999"  # newest by name, its copy cut short
    shutil.copytree(newest, half)
    (half / "optimizer.pt").write_bytes((half / "optimizer.pt").read_bytes()[:100])

    second = train(cfg, data, runs, "torn", tmp_path / "adapter", max_steps=6, checkpoint_every=2)
    assert (second.steps, second.start_step) == (6, 4)
    assert (run / (RAY_RECORD + ".torn")).read_text() == text[: len(text) // 2]
    assert (tmp_path / "adapter" / "adapter_model.safetensors").stat().st_size > 0
