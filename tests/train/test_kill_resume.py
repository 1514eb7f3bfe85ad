"""Kill -9 during training: ``python jobs/train.py`` (= ``canopy train``) as a user
starts it, with its own local Ray, on a tiny data set with the packaged MiniLM, checkpointing
every 2 steps. Every process of the run is SIGKILLed once Ray Train has registered a
checkpoint; the same command again must continue from the newest registered checkpoint
(its step, its adapter and optimizer state), not from step 0, and write a loadable adapter."""

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from canopy_ray.trainer import RAY_RECORD, registered_step
from tests.jobs.processes import KillableJob
from tests.train.conftest import TINY_ITEMS, tiny_items, tiny_questions

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MAX_STEPS, EVERY = 20, 2


@pytest.fixture()
def setup(tmp_path):
    data = tmp_path / "data" / "hotpotqa"  # a shared-set name, already converted: used as is
    data.mkdir(parents=True)
    (data / "corpus.jsonl").write_text("".join(json.dumps(i) + "\n" for i in tiny_items()))
    (data / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in tiny_questions(40)))
    cfg = yaml.safe_load((ROOT / "configs" / "cpu.yaml").read_text())
    # no dropout: the resumed steps are then a function of the restored state alone; no choice
    # on validation: the written adapter is the last checkpoint's
    cfg["training"].update(batch_size=4, epochs=4, val_instances=0, val_items=0, patience=None,
                           lora_dropout=0.0)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    argv = [sys.executable, str(ROOT / "jobs" / "train.py"), "--config", str(tmp_path / "cfg.yaml"),
            "--name", "kill", "--storage", str(tmp_path / "runs"), "--work-dir", str(tmp_path / "data"),
            "--sets", "hotpotqa", "--max-steps", str(MAX_STEPS), "--checkpoint-every", str(EVERY),
            "--out", str(tmp_path / "adapter"), "--address", "local"]
    return argv, tmp_path / "runs" / "kill"


def test_training_killed_resumes_from_its_last_checkpoint(setup, tmp_path):
    argv, run_dir = setup
    with KillableJob(argv, tmp_path / "killed.log", cwd=ROOT) as job:
        job.wait_for(lambda: registered_step(run_dir) is not None, 400, "registered checkpoint")
        job.kill_all()
        assert job.left_after(30) == []
    resume_at = registered_step(run_dir)
    assert resume_at is not None and 0 < resume_at < MAX_STEPS, resume_at
    assert not (tmp_path / "adapter").exists()  # the killed run never finished

    with KillableJob(argv, tmp_path / "rerun.log", cwd=ROOT) as job:
        assert job.wait(400) == 0, job.tail()
        assert job.left_after(30) == []
    summary = json.loads((tmp_path / "adapter" / "train_summary.json").read_text())
    assert (summary["start_step"], summary["steps"]) == (resume_at, MAX_STEPS)
    log = (tmp_path / "rerun.log").read_text()
    reported = sorted({int(n) for n in re.findall(r"metrics=\{'step': (\d+),", log)})
    assert reported == list(range(resume_at + EVERY, MAX_STEPS + 1, EVERY)), reported  # no step redone

    # The optimizer state came back with the weights: AdamW's own step counter went on from
    # the checkpoint's (a run restarted with the weights alone would count MAX_STEPS - resume_at).
    import torch

    final = run_dir / json.loads((run_dir / RAY_RECORD).read_text())["latest_checkpoint_result"][
        "checkpoint_dir_name"]
    state = torch.load(final / "optimizer.pt", weights_only=True)["state"]
    assert {int(s["step"]) for s in state.values()} == {MAX_STEPS}

    # The adapter written is the final checkpoint's; it loads as the node encoder and is not f0.
    assert (tmp_path / "adapter" / "adapter_model.safetensors").read_bytes() == \
        (final / "adapter_model.safetensors").read_bytes()
    from canopy_ray.core.evidence import piece
    from canopy_ray.core.hierarchy import build_tree
    from canopy_ray.core.items import parse_item
    from canopy_ray.models.encoder import TextEncoder, frozen_nodes

    tuned = TextEncoder(adapter=tmp_path / "adapter")
    assert tuned.adapter_id.startswith("lora-")
    tree = build_tree(parse_item(TINY_ITEMS[1]))
    pieces = [piece(tree, [n.span]) for n in tree.nodes()]
    a, b = tuned.encode_nodes(pieces), frozen_nodes(tuned).encode_nodes(pieces)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-4)
    assert np.abs(a - b).max() > 1e-4
