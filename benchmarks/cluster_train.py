"""Ray Train on several Ray nodes, a node lost after a checkpoint (docs/multi-node.md).

    python benchmarks/cluster_train.py [--out results/bench/cluster.md]

f_theta trained on the bundled HotpotQA sample with configs/cpu.yaml's recipe (no dropout) on a
head without CPUs and three worker nodes of 1 CPU (one Train worker per node): 1 worker, 2
data-parallel workers, and 2 workers again with the node of one of them SIGKILLed after the first
checkpoint (:func:`tests.support.node_loss.train_with_node_loss`: Ray Train restarts both on the
nodes left, from that checkpoint); the validation decision accuracy at every second step of each
run, and what the loss cost in wall time. The report and its other parts:
``benchmarks/cluster_report.py``.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

# a script's own folder (benchmarks/) is on the path, the repository root with tests.support is not
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cluster_report import ROOT, _s, main  # noqa: E402

from tests.support.local_cluster import LocalCluster  # noqa: E402
from tests.support.node_loss import TRAIN_WORKER, train_on_cluster, train_with_node_loss  # noqa: E402

ALT = "1 vs 2 Train workers, a node lost"


def measure(work: Path, steps: int = 20) -> dict:
    """The three runs of the module docstring, ``steps`` steps each, a checkpoint every 2."""
    sample = ROOT / "canopy_ray" / "assets" / "sample"
    work.mkdir(parents=True, exist_ok=True)
    runs = {}
    with LocalCluster(workers=3, worker_cpus=1) as cluster:
        for name, n in (("1", 1), ("2", 2), ("2, node lost", 2)):
            log, key = work / f"w{len(runs)}.log", f"w{len(runs)}"
            o = {"training": {"workers": n, "epochs": 3, "lora_dropout": 0.0, "val_instances": 64, "val_items": 0,
                              "max_failures": 1}}
            kw = dict(data={"hotpotqa": sample}, storage=work / "runs", name=key, out=work / f"adapter-{key}",
                      overrides=o, config=str(ROOT / "configs" / "cpu.yaml"), max_steps=steps, every=2)
            t = time.monotonic()
            res = (train_with_node_loss(cluster, log, after_step=2, timeout=1500, **kw) if "lost" in name
                   else train_on_cluster(cluster, log, timeout=1500, **kw))
            curve = {int(a): float(b) for a, b in re.findall(r"step (\d+): validation decision accuracy ([\d.]+)",
                                                             log.read_text(errors="replace"))}
            runs[name] = res | {"curve": sorted(curve.items()), "driver_s": time.monotonic() - t}
        placement = cluster.actors_by_node(TRAIN_WORKER, state=None)
    return {"runs": runs, "placement": placement, "steps": steps}


def table(r: dict) -> list[str]:
    lines = ["### Ray Train: f_theta with 1 and 2 data-parallel workers, and a node lost", "",
             "| workers | steps | resumed from step | instances | wall s (the call) | s in training steps (rank 0, "
             "since the last start) | validation decision accuracy, last |", "|---|---|---|---|---|---|---|"]
    for n, run in r["runs"].items():
        last = run["curve"][-1][1] if run["curve"] else None
        lines.append(f"| {n} | {run['steps']} | {run['start_step']} | {run['instances']} | {run['wall_s']:.1f} "
                     f"| {run['train_s']:.1f} | {_s(last, '{:.4f}')} |")
    lost = r["runs"].get("2, node lost")
    if lost:
        cost = lost["wall_s"] - r["runs"]["2"]["wall_s"]
        lines += ["", f"The node lost ({lost['lost']}) held a Train worker; it was SIGKILLed when Ray Train had "
                      f"registered the checkpoint of step {lost['registered_at_kill']}, and the run finished "
                      f"{lost['after_kill_s']:.1f} s later, {cost:+.1f} s against the uninterrupted 2-worker run."]
    return lines + ["", f"Ray Train worker actors per node over the three runs: {r['placement']}. Each global batch "
                        "is dealt over the workers and DDP averages their gradients, so the curves should agree to "
                        "noise.", ""]


def plot(r: dict, path: Path) -> Path:
    from canopy_ray.plots import pyplot, save

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for (n, run), ls in zip(r["runs"].items(), ("-", "--", ":")):
        workers, _, lost = n.partition(", ")
        ax.plot([s for s, _ in run["curve"]], [a for _, a in run["curve"]], ls, marker="o", ms=3,
                label=f"{workers} worker{'s' if workers != '1' else ''}" + (f", {lost}" if lost else ""))
        if "registered_at_kill" in run:
            ax.axvline(run["registered_at_kill"], color="grey", lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("validation decision accuracy")
    ax.legend(fontsize=8)
    ax.set_title("f_theta training: 1 worker, 2 workers, 2 workers with a node lost", fontsize=10)
    return save(fig, path, 120)


if __name__ == "__main__":
    raise SystemExit(main("train", measure, __doc__))
