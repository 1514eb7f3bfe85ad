"""Turn a results folder into a markdown table and PNG plots.

    python -m canopy_ray.eval.report RESULTS_DIR [--out DIR]

Reads every run JSON under the folder (sweep points, or files written by ``jobs/eval.py``)
and writes ``results.md`` with, per data set:

- the **ablation**: every method at the ablation's k and B, each metric as mean [95% interval];
- **paired differences** against ``shipped`` on the same questions (method - shipped);
- latency per stage;
- the **sweep** table over k and B;

the **Pareto** tables (also ``pareto.md``): per data set and setting, each method's reader
tokens and answer recall (with the recalls, EM/F1 and paired differences against
``no_projection`` and ``shipped``) and shipped's k x B points; ``pareto_<dataset>_<setting>_<policy>.png``
draws them (methods as points with intervals on both axes, the sweep as lines);
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

ABLATION_COLUMNS = [("em", "EM"), ("f1", "F1"), ("answer_kept", "answer kept"), ("answer_recall", "answer recall (body)"),
                    ("answer_recall_informative", "answer recall (body, informative)"),
                    ("answer_recall_short", "answer recall (body, informative, short answers)"),
                    ("refinement_recall", "refinement recall (micro)"), ("evidence_recall", "evidence recall"),
                    ("retrieval_recall", "retrieval recall"), ("tokens", "reader tokens"), ("encoded_tokens", "encoded tokens"),
                    ("latency_compress", "compress s"), ("latency_llm_reader", "reader s"),
                    ("llm_calls", "LLM calls"), ("rounds", "rounds"), ("followup_seen_share", "follow-up seen")]
DIFF_COLUMNS = [("em", "ΔEM"), ("f1", "ΔF1"), ("answer_kept", "Δanswer kept"), ("answer_recall", "Δanswer recall (body)"),
                ("answer_recall_informative", "Δanswer recall (body, informative)"),
                ("evidence_recall", "Δevidence recall"),
                ("tokens", "Δreader tokens"), ("llm_calls", "ΔLLM calls")]
SWEEP_COLUMNS = [("f1", "F1"), ("em", "EM"), ("answer_kept", "answer kept"), ("answer_recall", "answer recall (body)"),
                 ("answer_recall_informative", "answer recall (body, informative)"),
                 ("refinement_recall", "refinement recall (micro)"), ("evidence_recall", "evidence recall"),
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


def setting(spec: dict) -> str:
    """A run's setting with its configured policy (``shipped``'s): different operating points,
    never one table."""
    return f"{spec['setting']} setting, {(spec.get('refinement') or {}).get('policy', '?')}"


def _groups(runs: list[dict], role: str) -> dict[tuple, list[dict]]:
    """Runs of one role by (dataset, setting, n, k, B of the ablation); methods sorted."""
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        if role in _roles(r):
            s = r["spec"]
            out[(s["dataset"], setting(s), s["n_questions"], s.get("reader", True))].append(r)
    return {k: sorted(v, key=lambda r: (_order(r["spec"]["method"]), r["spec"]["k"], r["spec"]["branching"]))
            for k, v in sorted(out.items())}


def _at_point(group: list[dict], k: int, b: int) -> list[dict]:
    """The runs of one (k, B) point; methods that ignore B at any B."""
    return [r for r in group if r["spec"]["k"] == k and (r["spec"]["branching"] == b or not _uses_b(r))]


def _uses_b(run: dict) -> bool:
    m = METHODS.get(run["spec"]["method"])
    return m is None or m.uses_branching


def _main_point(group: list[dict]) -> tuple[int, int]:
    """The ablation's (k, B): the one most methods ran at (ties: the smallest)."""
    counts = defaultdict(set)
    for r in group:
        for rr in group:
            if rr["spec"]["k"] == r["spec"]["k"] and (rr["spec"]["branching"] == r["spec"]["branching"] or not _uses_b(rr)):
                counts[(r["spec"]["k"], r["spec"]["branching"])].add(rr["spec"]["method"])
    return min(counts, key=lambda kb: (-len(counts[kb]), kb))


def ablation_markdown(runs: list[dict]) -> list[str]:
    lines = []
    for (dataset, label, n, reader), group in _groups(runs, "ablation").items():
        if len({r["spec"]["method"] for r in group}) == 1 and len(group) > 1:
            continue  # one method over several points: a sweep, in the sweep table
        k, b = _main_point(group)
        group = _at_point(group, k, b)
        adapters = sorted({r["spec"]["node_adapter"] for r in group})
        note = "" if reader else ", reader skipped: EM/F1 not measured"
        lines += [f"## {dataset}: methods ({label}, k={k}, B={b}, {n} questions{note})", "",
                  f"Node encoder(s): {', '.join(adapters)}; reader: "
                  f"{', '.join(sorted({r['spec']['llm_model'] or '?' for r in group}))}. "
                  "Mean [95% bootstrap interval] over questions.", ""]
        rows = [[r["spec"]["method"], *(cell(r["aggregate"].get(m), m) for m, _ in ABLATION_COLUMNS)]
                for r in group]
        lines += _table(["method", *(h for _, h in ABLATION_COLUMNS)], rows) + [""]
        base = next((r for r in group if r["spec"]["method"] == "shipped"), None)
        if base is not None and len(group) > 1:
            lines += [f"Paired differences, method - shipped (same {n} questions):", ""]
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
    for (dataset, label, n, reader), group in _groups(runs, "grid").items():
        if len({(r["spec"]["k"], r["spec"]["branching"]) for r in group}) < 2:
            continue  # one point: the methods table has it
        note = "" if reader else ", reader skipped: EM/F1 not measured"
        lines += [f"## {dataset}: sweep over k and B ({label}, {n} questions{note})", ""]
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
    from canopy_ray.plots import pyplot, save

    plt = pyplot()

    groups = _groups(runs, "grid")
    if not groups:
        return None
    metrics = [("f1", "F1")] if any(reader for *_, reader in groups) else []  # no F1 row when no run read
    metrics.append(("answer_recall", "answer recall (body)"))
    fig, axes = plt.subplots(len(metrics), len(groups), figsize=(4.2 * len(groups), 3.2 * len(metrics)),
                             squeeze=False)
    for col, ((dataset, label, n, reader), group) in enumerate(groups.items()):
        b0 = min(r["spec"]["branching"] for r in group)
        by_method = defaultdict(list)
        for r in group:
            if r["spec"]["branching"] == b0:
                by_method[r["spec"]["method"]].append(r)
        title = f"{dataset}, {label}\n(B={b0}, n={n}{'' if reader else ', no reader'})"
        for row, (metric, ylabel) in enumerate(metrics):
            ax = axes[row][col]
            if metric == "f1" and not reader:
                ax.text(0.5, 0.5, "reader skipped:\nno EM/F1", ha="center", va="center", transform=ax.transAxes)
                ax.set_axis_off()
                ax.set_title(title, fontsize=9)
                continue
            for method, rs in sorted(by_method.items(), key=lambda kv: _order(kv[0])):
                rs = sorted(rs, key=lambda r: r["spec"]["k"])
                xs, ys = [_mean(r, "tokens") for r in rs], [_mean(r, metric) for r in rs]
                ax.plot(xs, ys, marker="o", label=method, color=f"C{_order(method)}")
                for r, x, y in zip(rs, xs, ys):
                    ax.annotate(f"k={r['spec']['k']}", (x, y), textcoords="offset points", xytext=(4, 4),
                                fontsize=7)
            ax.set_xlabel("reader evidence tokens")
            ax.set_ylabel(ylabel)
            ax.set_title(title, fontsize=9)
            ax.grid(alpha=0.3)
            if row == len(metrics) - 1:
                ax.legend(fontsize=7)
    return save(fig, path, 72)


def plot_tokens_by_b(runs: list[dict], path: Path) -> Path | None:
    from canopy_ray.plots import pyplot, save

    plt = pyplot()

    groups = {key: [r for r in g if METHODS.get(r["spec"]["method"]) is None
                    or METHODS[r["spec"]["method"]].uses_branching]
              for key, g in _groups(runs, "grid").items()}
    groups = {k: g for k, g in groups.items() if g}
    if not groups:
        return None
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.4), squeeze=False)
    for col, ((dataset, where, n, reader), group) in enumerate(groups.items()):
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
        ax.set_title(f"{dataset}, {where} (n={n}{'' if reader else ', no reader'})", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save(fig, path, 72)


def _pareto_sets(runs: list[dict]) -> dict[tuple, dict]:
    """Per (data set, setting): ``main`` (each method at the ablation's point, the largest
    sample) and ``curve`` (shipped over k x B, the sample with most of its points)."""
    by: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        by[(r["spec"]["dataset"], setting(r["spec"]))].append(r)
    out = {}
    for key, group in sorted(by.items()):
        n_main = max(r["spec"]["n_questions"] for r in group)
        big = [r for r in group if r["spec"]["n_questions"] == n_main]
        main = sorted(_at_point(big, *_main_point(big)), key=lambda r: _order(r["spec"]["method"]))
        shipped = [r for r in group if r["spec"]["method"] == "shipped"]
        ns = defaultdict(list)
        for r in shipped:
            ns[r["spec"]["n_questions"]].append(r)
        curve = max(ns.values(), key=len) if ns else []
        curve = sorted(curve, key=lambda r: _mean(r, "tokens")) if len(curve) > 1 else []
        out[key] = {"main": main, "curve": curve}
    return out


def _slug(label: str) -> str:
    return label.replace(" setting", "").replace(", ", "_").replace(" ", "_").replace("=", "")


def _ratio(a: dict, b: dict, m: str) -> str:
    x, y = _mean(a, m), _mean(b, m)
    return "-" if not (y and y == y and x == x) else f"{x / y - 1:+.1%}"


LEGEND = ("Mean [95% bootstrap interval] over questions. Answer kept (the headline): a gold answer in the "
          "reader's evidence, the titles and table header rows of the items kept included (an item left out "
          "takes its title with it), over the questions whose shown items, whole, hold one (n_ans; none "
          "yes/no). Answer recall (titles aside): a gold answer in the body of the "
          "reader's evidence (each item's title and a table's header row left out: every method keeps them); "
          "an answer of one or two characters counts only as a whole number or cell, and of several gold "
          "answers (a multi-span answer's spans too) any one counts; informative: the questions with an "
          "answer, none yes/no, none in a shown title or table header row (n_inf of them); short: the "
          "informative ones with a one- or two-character answer (n_short of them); with heads: over the whole "
          "evidence, titles and header rows included. Refinement recall: micro over gold leaves shown. "
          "Δ columns: paired differences on the same questions.")


def pareto_markdown(runs: list[dict]) -> list[str]:
    """Reader tokens against answer recall: one table per data set and setting, after one legend."""
    lines = []
    for (dataset, label), sets in _pareto_sets(runs).items():
        main, curve = sets["main"], sets["curve"]
        if not main:
            continue
        ref = next((r for r in main if r["spec"]["method"] == "no_projection"), None)
        base = next((r for r in main if r["spec"]["method"] == "shipped"), None)
        k, b = main[0]["spec"]["k"], main[0]["spec"]["branching"]
        lines += [f"### {dataset}, {label}: reader tokens vs answer recall (k={k}, B={b})", ""]
        kept, inf, short = "answer_kept", "answer_recall_informative", "answer_recall_short"
        cols = ["method", "n", "reader tokens", "n_ans", "answer kept", "answer recall", "n_inf",
                "answer recall, informative",
                "n_short", "short answers", "with heads", "refinement recall", "evidence recall", "EM", "F1"]
        if ref:
            cols += ["tokens vs no_projection", "Δanswer kept vs no_projection", "Δinformative vs no_projection"]
        if base:
            cols += ["Δanswer kept vs shipped", "Δevidence recall vs shipped"]
        rows = []
        for r in main:
            agg = r["aggregate"]
            row = [r["spec"]["method"], str(len([x for x in r["records"] if "error" not in x])),
                   cell(agg.get("tokens"), "tokens"), str((agg.get(kept) or {}).get("n", "-")),
                   cell(agg.get(kept), kept), cell(agg.get("answer_recall"), "answer_recall"),
                   str((agg.get(inf) or {}).get("n", "-")), cell(agg.get(inf), inf),
                   str((agg.get(short) or {}).get("n", "-")),
                   *(cell(agg.get(m), m) for m in (short, "answer_recall_titled", "refinement_recall",
                                                   "evidence_recall", "em", "f1"))]
            if ref:
                d = paired_differences(r["records"], ref["records"], [kept, inf])
                row += [_ratio(r, ref, "tokens"), *("-" if r is ref else cell(d[m], m) for m in (kept, inf))]
            if base:
                d = paired_differences(r["records"], base["records"], [kept, "evidence_recall"])
                row += ["-" if r is base else cell(d[m], m) for m in (kept, "evidence_recall")]
            rows.append(row)
        lines += _table(cols, rows) + [""]
        if curve:
            lines += [f"shipped over k x B ({curve[0]['spec']['n_questions']} questions):", ""]
            rows = [[str(r["spec"]["k"]), str(r["spec"]["branching"]),
                     *(cell(r["aggregate"].get(m), m) for m in ("tokens", kept, inf, "evidence_recall"))]
                    for r in curve]
            lines += _table(["k", "B", "reader tokens", "answer kept", "informative", "evidence recall"],
                            rows) + [""]
    return [LEGEND, ""] + lines if lines else []


def plot_pareto(runs: list[dict], out: Path) -> list[Path]:
    """``pareto_<dataset>_<setting>_<policy>.png``: each method a point with its intervals on both axes,
    shipped's k x B sweep as one line per B through k."""
    from canopy_ray.plots import pyplot, save

    plt = pyplot()

    paths = []
    for (dataset, label), sets in _pareto_sets(runs).items():
        main, curve = sets["main"], sets["curve"]
        if not main:
            continue
        fig, ax = plt.subplots(figsize=(5.6, 4.2))
        by_b = defaultdict(list)  # the sweep: one line per B through k
        for r in curve:
            by_b[r["spec"]["branching"]].append(r)
        for i, (b, rs) in enumerate(sorted(by_b.items())):
            rs = sorted(rs, key=lambda r: r["spec"]["k"])
            xs, ys = [_mean(r, "tokens") for r in rs], [_mean(r, "answer_kept") for r in rs]
            ax.plot(xs, ys, "--.", color=str(0.3 + 0.2 * i), lw=1, zorder=1,
                    label=f"shipped B={b}, k={','.join(str(r['spec']['k']) for r in rs)} (n={rs[0]['spec']['n_questions']})")
        for r in main:
            t, a = r["aggregate"]["tokens"], r["aggregate"].get("answer_kept") or {}
            if t.get("mean") is None or a.get("mean") is None:
                continue
            m = r["spec"]["method"]
            ax.errorbar(t["mean"], a["mean"], xerr=[[t["mean"] - t["low"]], [t["high"] - t["mean"]]],
                        yerr=[[a["mean"] - a["low"]], [a["high"] - a["mean"]]], fmt="osD^vP<>"[_order(m) % 8],
                        capsize=3, alpha=0.8, mfc="none" if m != "shipped" else None,
                        color=f"C{_order(m)}", label=f"{m} (n={a['n']})", zorder=2)
        k, b = main[0]["spec"]["k"], main[0]["spec"]["branching"]
        ax.set_xlabel("reader evidence tokens (mean per question)")
        ax.set_ylabel("answer kept (questions the whole items answer)")
        ax.set_title(f"{dataset}, {label} (methods at k={k}, B={b})", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        paths.append(save(fig, out / f"pareto_{dataset}_{_slug(label)}.png", 80))
    return paths


def write_report(results_dir: str | Path, out_dir: str | Path | None = None) -> dict:
    """Write ``results.md``, ``quality_vs_tokens.png`` and ``tokens_by_b.png``; return their paths."""
    results_dir = Path(results_dir)
    out = Path(out_dir) if out_dir else results_dir
    out.mkdir(parents=True, exist_ok=True)
    runs = load_runs(results_dir)
    lines = ["# CANOPY evaluation", "",
             f"{len(runs)} runs from `{results_dir}`. EM/F1: reader answer vs gold (SQuAD normalisation); "
             "answer recall: a gold answer occurs in the body of the reader's evidence, titles and table header "
             "rows left out (reader-independent); refinement "
             "recall (the paper's): gold leaves kept over gold leaves of the gold items shown to refinement, "
             "micro over questions; evidence recall (end to end): a question's gold leaves kept, unretrieved "
             "gold counting as missed, averaged per question; retrieval recall: gold items retrieved; reader "
             "tokens: the reader's evidence in the reader's tokens (each run's `spec.tokens_in`); encoded "
             "tokens: what the node encoder read to compress it. `shipped`: the configured policy (the run's "
             "setting names it). `random` and `flat_matched` replay shipped's "
             "run with each item cut to its tokens for it (random leaves; best leaves by f_theta); "
             "`random_total` with random leaves of any item up to its tokens for the question.", ""]
    pareto = pareto_markdown(runs)
    if pareto:
        lines += ["## Reader tokens vs answer recall", ""] + pareto
    lines += ablation_markdown(runs) + sweep_markdown(runs)
    paths = {"markdown": out / "results.md"}
    write_text(paths["markdown"], "\n".join(lines) + "\n")
    if pareto:
        paths["pareto_markdown"] = out / "pareto.md"
        write_text(paths["pareto_markdown"], "\n".join(["# Reader tokens vs answer recall", ""] + pareto) + "\n")
    for i, p in enumerate(plot_pareto(runs, out)):
        paths[f"pareto_{i}"] = p
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
