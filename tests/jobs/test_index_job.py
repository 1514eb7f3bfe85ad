"""``python jobs/index.py`` as a user runs it: its own local Ray, exit code, files, summary."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "fixtures" / "index" / "corpus.jsonl"

pytestmark = pytest.mark.integration


def test_index_job_runs_and_reports(tmp_path):
    out = tmp_path / "index"
    cmd = [sys.executable, str(ROOT / "jobs" / "index.py"), "--config", str(ROOT / "configs" / "cpu.yaml"),
           "--corpus", str(CORPUS), "--out", str(out), "--num-cpus", "2", "--actors", "1",
           "--shard-items", "10", "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["items"] == 13 and summary["skipped"] == 6 and summary["items_per_s"] > 0
    assert "skipped 6 of 19 lines" in proc.stdout
    assert len(list(out.glob("*.faiss"))) == 2 and (out / "manifest.json").exists()
    # what rebuilds it is kept beside it: the config as run (the overrides folded in), the corpus
    from canopy_ray.config import load_config

    kept = load_config(out / "index-config.yaml")
    assert kept == load_config(ROOT / "configs" / "cpu.yaml", index={"actors": 1, "shard_items": 10})
    assert json.loads((out / "rebuild.json").read_text())["corpus"] == str(CORPUS)

    bad = subprocess.run([sys.executable, str(ROOT / "jobs" / "index.py"), "--corpus", str(tmp_path / "nope.jsonl"),
                          "--out", str(out)], capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and "not found" in bad.stderr
