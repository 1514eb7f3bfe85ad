"""A whole worker node lost mid-job: the index job on a head and two worker nodes
(``tests/support/local_cluster.py``: one ``ray start`` per node on 127.0.0.1, token auth on), its
two embedding actors spread one per worker; worker-1 is then SIGKILLed, every process of it
(raylet, agents, the embedding actor's worker) at once.

The job finishes by itself: the GCS marks the node dead, Ray Data restarts the lost actor on
worker-2 and retries its slices. (Had the driver failed instead, the same command again would
resume it; :func:`tests.support.node_loss.index_with_node_loss` does that and says so, and the
test accepts it.) Its index equals an uninterrupted run's on the same cluster: the same ids, each
once; item and node vectors within 1e-3; the same manifest checksums (so in fact byte for byte).
"""

import shutil
from pathlib import Path

import pytest

from tests.support.local_cluster import RAY, LocalCluster
from tests.support.node_loss import (EMBEDDER, index_argv, index_with_node_loss, run_index_job, same_index,
                                     summary_of, text_corpus)

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which(RAY) is None, reason=f"no `ray` command next to the interpreter ({RAY})")]

ITEMS, SHARD_ITEMS = 40, 4  # 41 lines (one repeats an id): 11 input shards
TOL = 1e-3


@pytest.fixture(scope="module")
def cluster():
    # node death noticed after 5 missed 1 s health checks (Ray's default is 5 x 3 s)
    with LocalCluster(workers=2, worker_cpus=2, health_check_s=(1.0, 5)) as c:
        yield c


def test_index_job_survives_losing_a_worker_node(cluster, tmp_path):
    corpus = text_corpus(tmp_path / "corpus.jsonl", ITEMS)
    ref, out = tmp_path / "ref", tmp_path / "lost"
    # the reference with one actor: a slice's vectors do not depend on which actor embeds it
    rc, _ = run_index_job(cluster, index_argv(corpus, ref, actors=1, shard_items=SHARD_ITEMS), tmp_path / "ref.log",
                          300)
    assert rc == 0, (tmp_path / "ref.log").read_text()[-3000:]

    lost = index_with_node_loss(cluster, index_argv(corpus, out, actors=2, shard_items=SHARD_ITEMS), out,
                                tmp_path / "lost.log", victim="worker-1", at_fraction=0.0, timeout=300)
    # Ray Data spread its two actors one per worker node, none on the head (it has no CPUs)
    assert cluster.actors_by_node(EMBEDDER, state=None).keys() <= {"worker-1", "worker-2"}
    assert lost["embedders_at_kill"].get("worker-1") == 1
    assert any("raylet" in k for k in lost["killed"]) and any("SliceEmbedder" in k for k in lost["killed"]), \
        lost["killed"]  # the whole node went, its embedding actor with it
    assert lost["left_after_kill"] == []
    assert 1 <= lost["parts_at_kill"] < lost["shards"] == 11  # mid-job
    assert cluster.alive() == {"head", "worker-2"}
    assert lost["rc"] == 0, Path(lost["log"]).read_text()[-3000:]

    summary, want = lost["summary"], summary_of(tmp_path / "ref.log")
    for key in ("items", "nodes", "skipped", "skipped_by_reason", "duplicates", "input_lines"):
        assert summary[key] == want[key], key
    assert summary["items"] == ITEMS and summary["duplicates"] == 1
    if not lost["resubmitted"]:  # finished by itself: every line embedded once, none twice
        assert summary["rows_computed"] == ITEMS + 1 and summary["shards_computed"] == 11
    same = same_index(out, ref)
    assert same["ids_equal"] and same["ids_unique"] and same["count"] == ITEMS, same
    assert same["max_item_diff"] <= TOL and same["max_node_diff"] <= TOL, same
    assert same["checksums_equal"], same
    assert (out / "skipped.jsonl").read_text() == (ref / "skipped.jsonl").read_text()
