"""The ``train`` verb's command line: options, error exits and the written summary."""

import json
from pathlib import Path

import pytest

from canopy_ray import trainer
from canopy_ray.data.sets import SHARED_SETS, default_shared_root

CPU_CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "cpu.yaml")


def test_parser_defaults():
    args = trainer.build_parser().parse_args([])
    assert args.sets == list(SHARED_SETS) and args.shared_data == default_shared_root()
    assert (args.config, args.storage, args.checkpoint_every) == ("configs/cpu.yaml", "runs/train", 100)
    with pytest.raises(SystemExit):
        trainer.build_parser().parse_args(["--sets", "nope"])


def test_missing_raw_data_is_an_error_exit(tmp_path, capsys):
    rc = trainer.main(["--config", CPU_CONFIG, "--shared-data", str(tmp_path / "nowhere"),
                       "--work-dir", str(tmp_path / "work"), "--sets", "nq"])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not found" in err and "nowhere" in err


def test_bad_config_is_an_error_exit(tmp_path, capsys):
    rc = trainer.main(["--config", str(tmp_path / "missing.yaml"), "--work-dir", str(tmp_path)])
    assert rc == 2
    assert "missing.yaml" in capsys.readouterr().err
    rc = trainer.main(["--config", CPU_CONFIG, "--lr", "-1", "--work-dir", str(tmp_path)])
    assert rc == 2 and capsys.readouterr().err.startswith("error: ")


def test_overrides_reach_train_and_the_summary_is_written(tmp_path, monkeypatch, capsys):
    seen = {}

    def fake_train(cfg, dirs, storage, name, out, **kw):
        seen.update(cfg=cfg, dirs=dirs, out=out, kw=kw)
        return trainer.TrainResult(Path(out), 7, 40, 0.25, 3.04, 5.0, None, 2, 0.5)

    monkeypatch.setattr(trainer, "train", fake_train)
    monkeypatch.setattr("canopy_ray.data.sets.prepare_shared",
                        lambda root, work, names: {n: Path(work) / n for n in names})
    rc = trainer.main(["--config", CPU_CONFIG, "--storage", str(tmp_path), "--name", "r",
                       "--sets", "nq", "--lr", "0.01", "--epochs", "3", "--max-steps", "7"])
    assert rc == 0
    assert seen["cfg"].training.lr == 0.01 and seen["cfg"].training.epochs == 3
    assert list(seen["dirs"]) == ["nq"] and seen["out"] == tmp_path / "r" / "adapter"
    assert seen["kw"] == {"max_steps": 7, "checkpoint_every": 100, "time_budget_s": None}
    written = json.loads((tmp_path / "r" / "adapter" / "train_summary.json").read_text())
    assert written == json.loads(capsys.readouterr().out)
    assert (written["steps"], written["start_step"], written["train_s"]) == (7, 2, 3.0)
    assert written["training"]["lr"] == 0.01


def test_recipe_options_override_the_training_section(tmp_path, monkeypatch):
    seen = {}

    def fake_train(cfg, dirs, storage, name, out, **kw):
        seen["cfg"] = cfg
        return trainer.TrainResult(Path(out), 1, 1, 0.1, 1.0, 1.0, None, 0, None, 1, True)

    monkeypatch.setattr(trainer, "train", fake_train)
    monkeypatch.setattr("canopy_ray.data.sets.prepare_shared",
                        lambda root, work, names: {n: Path(work) / n for n in names})
    rc = trainer.main(["--config", CPU_CONFIG, "--storage", str(tmp_path), "--schedule", "cosine",
                       "--warmup", "0.05", "--val-items", "40", "--patience", "3",
                       "--max-length", "256", "--stop-repeat", "2", "--lora-rank", "384", "--lora-alpha", "128"])
    assert rc == 0
    tc = seen["cfg"].training
    assert (tc.schedule, tc.warmup, tc.val_items, tc.patience, tc.max_length, tc.stop_repeat) == (
        "cosine", 0.05, 40, 3, 256, 2)
    assert (tc.lora_rank, tc.lora_alpha) == (384, 128)
