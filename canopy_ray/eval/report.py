"""Turn a results folder into a markdown table and PNG plots.

    python -m canopy_ray.eval.report RESULTS_DIR [--out DIR]

Reads every run JSON under the folder (sweep points, or files written by ``jobs/eval.py``)
and writes ``results.md`` with, per data set:

- the **ablation**: every method at the ablation's k and B, each metric as mean [95% interval];
- **paired differences** against ``canopy`` on the same questions (method - canopy);
- latency per stage;
- the **sweep** table over k and B;

and two plots (matplotlib, Agg): ``quality_vs_tokens.png`` (F1 and answer recall against
reader tokens, one line per method, k as points, at the ablation's B: the paper's Figure 2)
and ``tokens_by_b.png`` (reader tokens against B, one line per k, for methods that use B).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from canopy_ray.core.files import write_text
from canopy_ray.eval.methods import METHODS
from canopy_ray.eval.runs import STAGES, paired_differences

ABLATION_COLUMNS = [("em", "EM"), ("f1", "F1"), ("answer_recall", "answer recall"), ("gold_recall", "gold recall"),
                    ("tokens", "reader tokens"), ("encoded_tokens", "encoded tokens"),
                    ("latency_compress", "compress s"), ("latency_llm_reader", "reader s"),
                    ("llm_calls", "LLM calls"), ("rounds", "rounds"), ("followup_seen_share", "follow-up seen")]
DIFF_COLUMNS = [("em", "ΔEM"), ("f1", "ΔF1"), ("answer_recall", "Δanswer recall"), ("gold_recall", "Δgold recall"),
                ("tokens", "Δreader tokens"), ("llm_calls", "ΔLLM calls")]
SWEEP_COLUMNS = [("f1", "F1"), ("em", "EM"), ("answer_recall", "answer recall"), ("gold_recall", "gold recall"),
                 ("tokens", "reader tokens"), ("tokens_before", "tokens before"),
                 ("encoded_tokens", "encoded tokens"), ("latency_compress", "compress s"), ("llm_calls", "LLM calls"),
                 ("rounds", "rounds")]
COUNTS = {"tokens", "tokens_before", "tokens_after", "encoded_tokens", "nodes_encoded"}


def load_runs(results_dir: str | Path) -> list[dict]:
    """Every run JSON (has ``spec``, ``aggregate`` and ``records``) under the folder, sorted."""
    runs = []
    for path in sorted(Path(results_dir).rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and {"spec", "aggregate", "records"} <= set(data):
            data["_path"] = str(path)
            runs.append(data)
    return runs


def _roles(run: dict) -> list[str]:
    return run.get("point", {}).get("roles") or ["ablation", "grid"]


def _order(method: str) -> int:
    return list(METHODS).index(method) if method in METHODS else len(METHODS)


def _num(x: float | None, metric: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if metric in COUNTS or metric.startswith("Δtokens"):
        return f"{x:,.0f}"
    if metric.startswith("latency"):
        return f"{x:.2f}"
    return f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"


def cell(agg: dict | None, metric: str, interval: bool = True) -> str:
    if not agg or agg.get("mean") is None:
        return "-"
    text = _num(agg["mean"], metric)
    if interval and agg.get("low") is not None:
        text += f" [{_num(agg['low'], metric)}, {_num(agg['high'], metric)}]"
    return text


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


def _groups(runs: list[dict], role: str) -> dict[tuple, list[dict]]:
    """Runs of one role by (dataset, setting, n, k, B of the ablation); methods sorted."""
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        if role in _roles(r):
            s = r["spec"]
            out[(s["dataset"], s["setting"], s["n_questions"], s.get("reader", True))].append(r)
    return {k: sorted(v, key=lambda r: (_order(r["spec"]["method"]), r["spec"]["k"], r["spec"]["branching"]))
            for k, v in sorted(out.items())}


def ablation_markdown(runs: list[dict]) -> list[str]:
    lines = []
    for (dataset, setting, n, _), group in _groups(runs, "ablation").items():
        specs = {(r["spec"]["k"], r["spec"]["branching"]) for r in group if r["spec"]["method"] == "canopy"}
        k, b = min(specs) if specs else (group[0]["spec"]["k"], group[0]["spec"]["branching"])
        adapters = sorted({r["spec"]["node_adapter"] for r in group})
        lines += [f"## {dataset}: methods ({setting} setting, k={k}, B={b}, {n} questions)", "",
                  f"Node encoder(s): {', '.join(adapters)}; reader: "
                  f"{', '.join(sorted({r['spec']['llm_model'] or '?' for r in group}))}. "
                  "Mean [95% bootstrap interval] over questions.", ""]
        rows = [[r["spec"]["method"], *(cell(r["aggregate"].get(m), m) for m, _ in ABLATION_COLUMNS)]
                for r in group]
        lines += _table(["method", *(h for _, h in ABLATION_COLUMNS)], rows) + [""]
        base = next((r for r in group if r["spec"]["method"] == "canopy"), None)
        if base is not None and len(group) > 1:
            lines += [f"Paired differences, method - canopy (same {n} questions):", ""]
            rows = []
            for r in group:
                if r is base:
                    continue
                d = paired_differences(r["records"], base["records"], [m for m, _ in DIFF_COLUMNS])
                rows.append([r["spec"]["method"], *(cell(d[m], m) for m, _ in DIFF_COLUMNS)])
            lines += _table(["method", *(h for _, h in DIFF_COLUMNS)], rows) + [""]
        lines += ["Latency per question (s; cached LLM calls charged their first-run time):", ""]
        stages = [s for s in STAGES if any((r["aggregate"].get(f"latency_{s}") or {}).get("mean") for r in group)]
        rows = [[r["spec"]["method"], *(cell(r["aggregate"].get(f"latency_{s}"), f"latency_{s}", False)
                                        for s in stages)] for r in group]
        lines += _table(["method", *stages], rows) + [""]
    return lines


def sweep_markdown(runs: list[dict]) -> list[str]:
    lines = []
    for (dataset, setting, n, reader), group in _groups(runs, "grid").items():
        note = "" if reader else ", reader skipped: EM/F1 not measured"
        lines += [f"## {dataset}: sweep over k and B ({setting} setting, {n} questions{note})", ""]
        rows = [[r["spec"]["method"], str(r["spec"]["k"]),
                 str(r["spec"]["branching"]) if METHODS.get(r["spec"]["method"]) is None
                 or METHODS[r["spec"]["method"]].uses_branching else "any",
                 *(cell(r["aggregate"].get(m), m) for m, _ in SWEEP_COLUMNS)] for r in group]
        lines += _table(["method", "k", "B", *(h for _, h in SWEEP_COLUMNS)], rows) + [""]
    return lines


def _mean(r: dict, m: str) -> float:
    v = (r["aggregate"].get(m) or {}).get("mean")
    return float("nan") if v is None else v


def plot_quality_vs_tokens(runs: list[dict], path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _groups(runs, "grid")
    if not groups:
        return None
    fig, axes = plt.subplots(2, len(groups), figsize=(4.2 * len(groups), 6.4), squeeze=False)
    for col, ((dataset, _, n, reader), group) in enumerate(groups.items()):
        b0 = min(r["spec"]["branching"] for r in group)
        by_method = defaultdict(list)
        for r in group:
            if r["spec"]["branching"] == b0:
                by_method[r["spec"]["method"]].append(r)
        for row, (metric, label) in enumerate((("f1", "F1"), ("answer_recall", "answer recall"))):
            ax = axes[row][col]
            if metric == "f1" and not reader:
                ax.text(0.5, 0.5, "reader skipped:\nno EM/F1", ha="center", va="center", transform=ax.transAxes)
                ax.set_axis_off()
                ax.set_title(f"{dataset} (B={b0}, n={n}, no reader)", fontsize=9)
                continue
            for method, rs in sorted(by_method.items(), key=lambda kv: _order(kv[0])):
                rs = sorted(rs, key=lambda r: r["spec"]["k"])
                xs, ys = [_mean(r, "tokens") for r in rs], [_mean(r, metric) for r in rs]
                ax.plot(xs, ys, marker="o", label=method, color=f"C{_order(method)}")
                for r, x, y in zip(rs, xs, ys):
                    ax.annotate(f"k={r['spec']['k']}", (x, y), textcoords="offset points", xytext=(4, 4),
                                fontsize=7)
            ax.set_xlabel("reader evidence tokens")
            ax.set_ylabel(label)
            ax.set_title(f"{dataset} (B={b0}, n={n}{'' if reader else ', no reader'})", fontsize=9)
            ax.grid(alpha=0.3)
            if row == 1:
                ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path


def plot_tokens_by_b(runs: list[dict], path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {key: [r for r in g if METHODS.get(r["spec"]["method"]) is None
                    or METHODS[r["spec"]["method"]].uses_branching]
              for key, g in _groups(runs, "grid").items()}
    groups = {k: g for k, g in groups.items() if g}
    if not groups:
        return None
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.4), squeeze=False)
    for col, ((dataset, _, n, reader), group) in enumerate(groups.items()):
        ax = axes[0][col]
        lines = defaultdict(list)
        for r in group:
            lines[(r["spec"]["method"], r["spec"]["k"])].append(r)
        for (method, k), rs in sorted(lines.items(), key=lambda kv: (_order(kv[0][0]), kv[0][1])):
            rs = sorted(rs, key=lambda r: r["spec"]["branching"])
            xs = [r["spec"]["branching"] for r in rs]
            ys = [_mean(r, "tokens") for r in rs]
            lo = [y - (r["aggregate"]["tokens"].get("low") or y) for r, y in zip(rs, ys)]
            hi = [(r["aggregate"]["tokens"].get("high") or y) - y for r, y in zip(rs, ys)]
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=f"{method} k={k}",
                        color=f"C{_order(method) * 3 + [5, 10, 20].index(k) if k in (5, 10, 20) else 0}")
        ax.set_xlabel("branching factor B")
        ax.set_ylabel("reader evidence tokens")
        ax.set_xticks(sorted({r["spec"]["branching"] for r in group}))
        ax.set_title(f"{dataset} (n={n}{'' if reader else ', no reader'})", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path


def write_report(results_dir: str | Path, out_dir: str | Path | None = None) -> dict:
    """Write ``results.md``, ``quality_vs_tokens.png`` and ``tokens_by_b.png``; return their paths."""
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir else results_dir
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(results_dir)
    lines = ["# CANOPY evaluation", "",
             f"{len(runs)} runs from `{results_dir}`. EM/F1: reader answer vs gold (SQuAD normalisation); "
             "answer recall: a gold answer occurs in the reader's evidence (reader-independent); gold recall: "
             "share of gold leaves kept; reader tokens: the reader's evidence in the reader's tokens (each run's "
             "`spec.tokens_in`); encoded tokens: what the node encoder read to compress it.", ""]
    lines += ablation_markdown(runs) + sweep_markdown(runs)
    paths = {"markdown": out / "results.md"}
    write_text(paths["markdown"], "\n".join(lines) + "\n")
    for name, fn in (("quality_vs_tokens", plot_quality_vs_tokens), ("tokens_by_b", plot_tokens_by_b)):
        p = fn(runs, out / f"{name}.png")
        if p is not None:
            paths[name] = p
    return {k: str(v) for k, v in paths.items()}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="canopy report", description="results folder -> markdown table and plots")
    p.add_argument("results_dir")
    p.add_argument("--out", default=None, help="where to write (default: the results folder)")
    args = p.parse_args(argv)
    if not Path(args.results_dir).is_dir():
        print(f"error: {args.results_dir} is not a folder", file=sys.stderr)
        return 2
    paths = write_report(args.results_dir, args.out)
    for v in paths.values():
        print(f"wrote {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
