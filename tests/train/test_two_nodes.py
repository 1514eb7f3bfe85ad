"""Ray Train over several nodes: f_theta's LoRA trained by 2 data-parallel workers on
worker nodes of 1 CPU each (``tests/support/local_cluster.py``; one Ray Train worker fits a node)
against 1 worker on the same cluster, and the 2-worker run loses a node mid-run: one worker node
holding a Train worker is SIGKILLed (raylet and every process on it) once a checkpoint is
registered, and Ray Train (``training.max_failures``) restarts both workers on the nodes left,
from that checkpoint. The loop deals each global batch over the workers and DDP averages their
gradients; with equal shares, no dropout and a data order that is a function of the step, the
two runs take the same steps and end with the same f_theta, to float noise: their node vectors
differ by under a tenth of what training moved them (measured: 3%). (The loss each reports is
rank 0's, over its share of the batches: not compared.)
"""

import shutil

import numpy as np
import pytest

from tests.support.local_cluster import RAY, LocalCluster
from tests.support.node_loss import TRAIN_WORKER, train_on_cluster, train_with_node_loss

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which(RAY) is None, reason=f"no `ray` command next to the interpreter ({RAY})")]


def test_two_workers_on_two_nodes_train_as_one_through_a_node_loss(tiny_bert_dir, tiny_data_dir, tmp_path):
    overrides = {"models": {"encoder_path": str(tiny_bert_dir), "max_length": 64},
                 # batch 4 splits 2 + 2: the mean of the workers' means is the batch mean
                 "training": {"batch_size": 4, "epochs": 6, "lr": 5e-3, "lora_layers": 1, "max_length": 64,
                              "lora_dropout": 0.0, "val_instances": 0, "val_items": 0, "stop_repeat": 1,
                              "max_failures": 1}}
    steps, every = 24, 2
    common = dict(data={"tiny": tiny_data_dir}, storage=tmp_path / "runs", max_steps=steps, every=every, limit=16)
    # Ray Train registers a checkpoint per poll of its workers: every 0.5 s (2 s by default) leaves
    # the 2-worker run ~5 s after its first checkpoint, time for the kill to land mid-run
    poll = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
    with LocalCluster(workers=3, worker_cpus=1, health_check_s=(1.0, 5), node_env=poll) as cluster:
        # the 1-worker run, the reference, checkpoints only at its end: each checkpoint waits for a poll
        one = train_on_cluster(cluster, tmp_path / "w1.log", name="w1", out=tmp_path / "adapter1",
                               **{**common, "every": steps},
                               overrides={**overrides, "training": {**overrides["training"], "workers": 1}})
        two = train_with_node_loss(cluster, tmp_path / "w2.log", name="w2", out=tmp_path / "adapter2",
                                   after_step=every, **common,
                                   overrides={**overrides, "training": {**overrides["training"], "workers": 2}})
        placed = cluster.actors_by_node(TRAIN_WORKER, state=None)
    # Train workers only on worker nodes; the 2-worker run's restart placed its two again
    assert "head" not in placed and sum(placed.values()) == 1 + 2 + 2, placed
    assert two["left"] == [], two["left"]  # the whole node went
    # the run finished by itself, resumed from the checkpoint registered when the node was lost (or
    # a newer one whose registration was under way), not from the start
    assert every <= two["registered_at_kill"] <= two["start_step"] < steps and two["start_step"] % every == 0, two
    assert one["steps"] == two["steps"] == steps
    # the same f_theta: node vectors of the two adapters differ by a small part of what training
    # moved them from f0 (Adam turns float noise on near-zero gradients into full-size steps, so
    # single weights may differ while the function does not)
    v1, v2, v0 = (_node_vectors(tiny_bert_dir, a) for a in (one["adapter_dir"], two["adapter_dir"], None))
    moved = np.linalg.norm(v1 - v0, axis=1).mean()
    assert moved > 1e-3  # it trained
    assert np.linalg.norm(v2 - v1, axis=1).mean() < 0.1 * moved


def _node_vectors(model_dir, adapter) -> np.ndarray:
    from canopy_ray.config import load_config
    from canopy_ray.core.evidence import Piece
    from canopy_ray.models.encoder import build_encoder

    from .conftest import TINY_ITEMS

    texts = [s for it in TINY_ITEMS for s in it.get("sentences", [])]
    cfg = load_config(None, models={"encoder_path": str(model_dir), "max_length": 64,
                                    "adapter": str(adapter) if adapter else None})
    return build_encoder(cfg.models).encode_nodes([Piece(f"p{i}", "text", ((0, 1),), t) for i, t in enumerate(texts)])
