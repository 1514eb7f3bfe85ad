"""The ``canopy`` verb registry and the ``jobs/*.py`` entry points that hand argv to it."""

import subprocess
import sys
from pathlib import Path

import pytest

from canopy_ray.cli import PASS_THROUGH, build_parser, main

ROOT = Path(__file__).resolve().parents[1]
JOBS = {"index": "index", "train": "train", "eval": "eval", "eval_refinement": "eval-refinement",
        "sweep": "sweep"}


def test_every_registered_verb_is_listed_and_has_a_main():
    import importlib

    listed = build_parser()._subparsers._group_actions[0].choices
    for verb, (module, _) in PASS_THROUGH.items():
        assert verb in listed
        assert callable(importlib.import_module(module).main)
    assert {"quickstart", "demo", "compress", "serve", "data"} <= set(listed)


@pytest.mark.parametrize("script,verb", sorted(JOBS.items()))
def test_each_job_hands_its_arguments_to_the_verb_of_its_name(script, verb):
    proc = subprocess.run([sys.executable, str(ROOT / "jobs" / f"{script}.py"), "--help"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(f"usage: canopy {verb} ")


def test_jobs_stay_thin():
    for path in (ROOT / "jobs").glob("*.py"):
        code = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.strip().startswith("#")]
        assert len(code) <= 20, f"{path.name}: {len(code)} lines; entry points hand argv to a CLI verb"


def test_compress_verb_prints_json_and_skips_bad_lines(tmp_path, capsys):
    items = tmp_path / "items.jsonl"
    items.write_text('{"id": "p1", "modality": "text", "title": "Saturn", "sentences": '
                     '["Saturn is the sixth planet.", "It has 95 moons.", "Its rings are ice."]}\n'
                     '{"id": "bad", "modality": "text"}\n')
    assert main(["compress", "--query", "Which planet has 95 moons?", "--items", str(items), "--json",
                 "--config", str(ROOT / "configs" / "cpu-frozen.yaml")]) == 0
    out = capsys.readouterr()
    import json

    (res,) = json.loads(out.out)
    assert res["id"] == "p1" and res["modality"] == "text" and res["nodes"][0]["span"] == [0, 3]
    assert "skipped line 2" in out.err
    # --policy replaces the config's: nothing beats a node by 1, so Algorithm 1 keeps the item whole
    assert main(["compress", "--query", "Which planet has 95 moons?", "--items", str(items), "--json",
                 "--config", str(ROOT / "configs" / "cpu-frozen.yaml"), "--policy", "canopy margin=1"]) == 0
    (wide,) = json.loads(capsys.readouterr().out)
    assert wide["kept"] == [[0, 3]] and wide["nodes"][0]["decision"] == "kept"
    assert wide["nodes"][0]["score"] is not None  # Algorithm 1 scores the root
    assert wide["kept"] != res["kept"]


def test_a_bad_config_is_a_clear_error(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("hierarchy: {branching: 1}\n")
    items = tmp_path / "items.jsonl"
    items.write_text('{"id": "p1", "modality": "text", "title": "T", "sentences": ["a.", "b."]}\n')
    assert main(["compress", "--query", "q", "--items", str(items), "--config", str(cfg)]) == 2
    assert "hierarchy.branching" in capsys.readouterr().err
