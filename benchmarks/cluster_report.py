"""The report of the engine on several Ray nodes (docs/multi-node.md), measured by parts:

    python benchmarks/cluster_index.py [--items 600] [--out results/bench/cluster.md]
    python benchmarks/cluster_serve.py [--out results/bench/cluster.md]
    python benchmarks/cluster_train.py [--out results/bench/cluster.md]
    python benchmarks/cluster_autoscale.py [--out results/bench/cluster.md]
    python benchmarks/cluster_sweep.py [--out results/bench/cluster.md]
    python benchmarks/cluster_report.py --out results/bench/cluster.md   # the report again from its JSON

Every part runs on a :class:`tests.support.local_cluster.LocalCluster` on 127.0.0.1: a head
without CPUs and worker nodes, token authentication on; a node is lost by SIGKILL of every process
of its ``ray start`` session (raylet, agents, the worker processes of its tasks and actors). Each
part's module says what it measures.

``--out`` also keeps the raw results as JSON beside the report (``cluster.json``): a part run
replaces its own entry and the report is drawn again from every part the JSON holds, each with
the command, the machine's load and the date it was measured by.

The run's own numbers only: wall times are compared within one run (other work shares the CPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _s(v, fmt="{:.1f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def sections() -> dict:
    """Each part's module (its ``table``, ``plot`` and ``ALT``) in the report's order, imported here
    and not at the top: each of them imports this module."""
    import cluster_autoscale
    import cluster_index
    import cluster_serve
    import cluster_sweep
    import cluster_train

    return {"index": cluster_index, "serve": cluster_serve, "train": cluster_train,
            "autoscale": cluster_autoscale, "sweep": cluster_sweep}


def report(results: dict, preface: str, out: Path) -> str:
    lines = ["# canopy-ray on several Ray nodes", "", preface, ""]
    for part, module in sections().items():
        if part in results:
            png = module.plot(results[part], out.with_name(f"cluster_{part}.png"))
            lines += module.table(results[part]) + [f"![{module.ALT}]({png.name})", ""]
    return "\n".join(lines)


def _by_stamp(results: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for part, r in results.items():
        out.setdefault(r["measured_by"], []).append(part)
    return out


def write(results: dict, out: Path | None) -> None:
    """The report of ``results`` printed, and written to ``out`` with its PNGs beside it."""
    preface = ("A head without CPUs and two worker nodes of 2 CPUs (train: three of 1 CPU) on 127.0.0.1 "
               "(`tests/support/local_cluster.py`), "
               "token auth on, Ray's default health checks (a node is marked dead after 5 missed checks 3 s apart); "
               "a node is lost by SIGKILL of every process of it at once. Measured by "
               + "; ".join(f"{stamp} ({', '.join(parts)})" for stamp, parts in _by_stamp(results).items()) + ".")
    markdown = report(results, preface, out or Path("cluster.md"))
    print(markdown)
    if out:
        out.write_text(markdown + "\n")


def _parser(description: str, options: dict[str, dict] | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    for flag, kw in (options or {}).items():
        p.add_argument(flag, **kw)
    p.add_argument("--out", default=None, help="write the report here (markdown; its PNGs and a JSON of the raw "
                                               "results beside it; parts not run now are kept from that JSON)")
    return p


def _kept(out: Path | None) -> dict:
    raw = out.with_suffix(".json") if out else None
    return json.loads(raw.read_text()) if raw and raw.exists() else {}


def main(part: str, measure, doc: str, argv=None, options: dict[str, dict] | None = None) -> int:
    """One part's command (``doc``: its module's docstring): ``measure(work_dir, **options)`` in a
    temporary directory, its results kept in the JSON beside ``--out`` at once (stamped with the
    command, the load and the date), then the report drawn again. ``options``: the part's own
    arguments, flag -> ``add_argument`` keywords."""
    args = vars(_parser(doc.split("\n")[0], options).parse_args(argv))
    out = args.pop("out")
    out = Path(out) if out else None
    results = _kept(out)
    command = " ".join([f"python benchmarks/cluster_{part}.py", *(sys.argv[1:] if argv is None else argv)])
    stamp = (f"`{command}` on {os.cpu_count()} CPU cores (load average {os.getloadavg()[0]:.1f} at the start: other "
             f"jobs share them), {time.strftime('%Y-%m-%d')}")
    with tempfile.TemporaryDirectory(prefix="canopy-cluster-") as tmp:
        results[part] = measure(Path(tmp) / part, **args) | {"measured_by": stamp}
    print(part, json.dumps({k: v for k, v in results[part].items() if k != "timeline"}, default=str), flush=True)
    if out:  # kept at once: the report can be drawn again from it
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    write(results, out)
    return 0


def redraw(argv=None) -> int:
    """The report drawn again from the JSON beside ``--out``, nothing measured."""
    args = _parser("The cluster report drawn again from its JSON (nothing measured).").parse_args(argv)
    out = Path(args.out) if args.out else None
    write(_kept(out), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(redraw())
