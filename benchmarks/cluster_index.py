"""The index job on several Ray nodes, a worker node lost mid-job (docs/multi-node.md).

    python benchmarks/cluster_index.py [--items 600] [--out results/bench/cluster.md]

The index job (``jobs/index.py``, 2 embedding actors: Ray Data spreads them one per worker node)
over ``--items`` synthetic text items on a head without CPUs and two worker nodes of 2 CPUs,
once uninterrupted and once with worker-1 killed when a quarter of the input shards are on disk
(:func:`tests.support.node_loss.index_with_node_loss`). The interrupted job finishes by itself (Ray
Data restarts the lost actor on the surviving node and retries its slices) or, if it fails, the
same command again resumes it. Its index must equal the uninterrupted run's; the table gives both
wall times and what the loss cost. The report and its other parts: ``benchmarks/cluster_report.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

# a script's own folder (benchmarks/) is on the path, the repository root with tests.support is not
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cluster_report import main  # noqa: E402

from tests.support.local_cluster import LocalCluster  # noqa: E402
from tests.support.node_loss import (EMBEDDER, index_argv, index_with_node_loss, run_index_job,  # noqa: E402
                                     same_index, summary_of, text_corpus)

ALT = "index job node loss"


def measure(work: Path, items: int) -> dict:
    corpus = text_corpus(work / "corpus.jsonl", items)
    with LocalCluster(workers=2, worker_cpus=2) as cluster:
        ref_out, lost_out = work / "ref", work / "lost"
        rc, ref_s = run_index_job(cluster, index_argv(corpus, ref_out), work / "ref.log")
        assert rc == 0, (work / "ref.log").read_text()[-3000:]
        placement = cluster.actors_by_node(EMBEDDER, state=None)
        lost = index_with_node_loss(cluster, index_argv(corpus, lost_out), lost_out, work / "lost.log")
        after = cluster.actors_by_node(EMBEDDER, state=None)
    same = same_index(lost_out, ref_out)
    return {"items": items, "ref_s": ref_s, "placement": placement, "placement_after": after, **lost,
            "same_index": same, "ref_summary": summary_of(work / "ref.log")}


def table(r: dict) -> list[str]:
    same = r["same_index"]
    how = "resubmitted (the same command again)" if r["resubmitted"] else "by itself"
    cost = r["total_s"] - r["ref_s"]
    return [
        f"### Index job, worker-1 lost ({r['items']} text items, 2 embedding actors, one per worker node)", "",
        "| run | wall s | input shards on disk at the kill | node marked dead after (s) | finished "
        "| index vs uninterrupted | cost of the loss |", "|---|---|---|---|---|---|---|",
        f"| uninterrupted | {r['ref_s']:.1f} | | | by itself | | |",
        f"| worker-1 SIGKILLed at {r['kill_s']:.1f} s ({len(r['killed'])} processes) | {r['total_s']:.1f} "
        f"| {r['parts_at_kill']} of {r['shards']} | {r['marked_dead_s']:.1f} | {how} "
        f"| ids equal {same['ids_equal']}, each once {same['ids_unique']}; max vector difference "
        f"{max(same['max_item_diff'], same['max_node_diff']):.2g}; manifest checksums equal {same['checksums_equal']} "
        f"| +{cost:.1f} s ({100 * cost / r['ref_s']:+.0f}%) |", "",
        f"Embedding actors per node over both runs (`ray list actors`; a restarted actor keeps its id and shows "
        f"where it ran last): {r['placement_after']}. Lines embedded by the interrupted run: "
        f"{(r['summary'] or {}).get('rows_computed')} of {(r['summary'] or {}).get('input_lines')} (none twice).", ""]


def plot(r: dict, path: Path) -> Path:
    from canopy_ray.plots import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 2.6))
    ax.barh([1, 0], [r["ref_s"], r["total_s"]], color=["#4c72b0", "#dd8452"])
    ax.set_yticks([1, 0], ["uninterrupted", "worker-1 lost"])
    ax.axvline(r["kill_s"], color="k", ls="--", lw=1, label="worker-1 SIGKILLed")
    ax.axvline(r["kill_s"] + r["marked_dead_s"], color="r", ls=":", lw=1, label="marked dead by the GCS")
    ax.set_xlabel("seconds (index job wall time)")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(f"Index job over 2 worker nodes, {r['items']} items", fontsize=10)
    return save(fig, path, 120)


if __name__ == "__main__":
    raise SystemExit(main("index", measure, __doc__,
                          options={"--items": {"type": int, "default": 600, "help": "text items of the index part"}}))
