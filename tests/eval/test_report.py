"""The report: a folder of run JSONs -> markdown tables (ablation with intervals, paired
differences, latency, sweep) and two PNG plots."""

import json

from canopy_ray.eval.report import main, write_report
from canopy_ray.core.files import write_json
from canopy_ray.eval.runs import aggregate


def _run(method, k, b, f1s, tokens, roles=None, informative=(1.0, 1.0, None, None)):
    recs = [{"id": f"q{i}", "f1": f, "em": float(f == 1.0), "answer_recall": 1.0, "answer_recall_informative": inf,
             "tokens": t, "llm_calls": 2, "rounds": 1, "latency_total": 1.5}
            for i, (f, t, inf) in enumerate(zip(f1s, tokens, informative))]
    run = {"spec": {"dataset": "tiny", "method": method, "setting": "given", "k": k, "branching": b,
                    "n_questions": len(recs), "node_adapter": "frozen", "llm_model": "scripted"},
           "aggregate": aggregate(recs), "errors": 0, "records": recs}
    if roles:
        run["point"] = {"roles": roles}
    return run


def test_report_writes_tables_and_plots(tmp_path):
    res = tmp_path / "res"
    write_json(res / "points" / "a.json", _run("canopy", 10, 2, [1.0, 0.5, 0.0, 1.0], [100, 120, 80, 90],
                                               ["ablation", "grid"]))
    write_json(res / "points" / "b.json", _run("vanilla", 10, 2, [1.0, 0.0, 0.0, 1.0], [300, 320, 280, 290],
                                               ["ablation", "grid"]))
    write_json(res / "points" / "c.json", _run("canopy", 5, 2, [0.5, 0.5, 0.0, 1.0], [60, 70, 50, 40], ["grid"]))
    write_json(res / "points" / "d.json", _run("canopy", 5, 3, [0.5, 0.5, 0.0, 1.0], [70, 80, 60, 50], ["grid"]))
    (res / "sweep.json").write_text(json.dumps({"spec": {}}))  # not a run: ignored
    paths = write_report(res)
    md = (res / "results.md").read_text()
    assert "## tiny: methods (given setting, k=10, B=2, 4 questions)" in md
    assert "| canopy | 0.500 [0.000, 1.000] | 0.625 [" in md  # EM then F1 with intervals
    # paired, vanilla - canopy: same EM on every question, F1 lower on one, +200 tokens on each
    assert "| vanilla | 0.000 [0.000, 0.000] | -0.125 [-0.375, 0.000] |" in md and "| 200 [200, 200] |" in md
    assert "## tiny: sweep over k and B (given setting, 4 questions)" in md
    assert "| canopy | 5 | 3 |" in md and "| vanilla | 10 | any |" in md
    # the Pareto table and plot: methods at the ablation's point, CANOPY over k x B as a curve
    assert "### tiny, given setting: reader tokens vs answer recall (k=10, B=2)" in md
    assert "| canopy | 4 | 98 [" in md and "| 5 | 3 | 65 [" in md
    assert (res / "pareto.md").read_text().startswith("# Reader tokens vs answer recall")
    assert (res / "pareto_tiny_given.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("quality_vs_tokens", "tokens_by_b"):
        assert (res / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and name in paths
    assert main([str(res), "--out", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "results.md").exists()
    assert main([str(tmp_path / "missing")]) == 2


def test_pareto_compares_with_no_projection_and_keeps_the_ablation_point(tmp_path):
    res = tmp_path / "res"
    write_json(res / "a.json", _run("canopy", 10, 2, [1.0, 0.5, 0.0, 1.0], [100, 120, 80, 90],
                                    informative=(1.0, 0.0, None, None)))
    write_json(res / "b.json", _run("no_projection", 10, 2, [1.0, 0.0, 0.0, 1.0], [200, 240, 160, 180],
                                    informative=(1.0, 1.0, None, None)))
    write_json(res / "c.json", _run("random", 10, 2, [0.0, 0.0, 0.0, 1.0], [100, 118, 80, 90]))
    write_json(res / "d.json", _run("canopy", 20, 3, [0.0, 0.0, 0.0, 1.0], [50, 50, 50, 50]))
    write_report(res)
    md = (res / "results.md").read_text()
    # canopy uses half of no_projection's tokens and keeps the answer of one of the two
    # informative questions (n_inf 2) where no_projection keeps both; the k=20 point is in the
    # curve, not the ablation
    assert "| canopy | 4 | 98 [" in md and "| 1.000 [1.000, 1.000] | 2 | 0.500 [0.000, 1.000] |" in md
    assert "| -50.0% | 0.000 [0.000, 0.000] | -0.500 [-1.000, 0.000] | - | - |" in md
    assert "| no_projection | 4 | 195 [" in md and "| 2 | 1.000 [1.000, 1.000] |" in md
    assert "| +0.0% | - | - | 0.500 [0.000, 1.000] | - |" in md
    ablation = md.split("## tiny: methods")[1].split("Paired differences")[0]
    assert ablation.count("| canopy |") == 1 and "| random |" in ablation


def test_runs_at_another_margin_are_another_operating_point(tmp_path):
    res = tmp_path / "res"
    for margin, tokens in ((0.0, [100, 120, 80, 90]), (0.05, [180, 200, 160, 170])):
        for method in ("canopy", "no_projection"):
            run = _run(method, 10, 2, [1.0, 0.5, 0.0, 1.0], tokens if method == "canopy" else [200] * 4)
            run["spec"]["margin"] = margin
            write_json(res / f"{margin}" / f"{method}.json", run)
    write_report(res)
    md = (res / "pareto.md").read_text()
    # one table each, never the two margins' canopy runs in one
    assert "### tiny, given setting: reader tokens vs answer recall" in md
    assert "### tiny, given setting, margin 0.05: reader tokens vs answer recall" in md
    assert (res / "pareto_tiny_given_margin0.05.png").exists() and (res / "pareto_tiny_given.png").exists()
    assert "| canopy | 4 | 98 [" in md and "| canopy | 4 | 178 [" in md


def test_hybrid_runs_are_named_by_share_and_cutoff(tmp_path):
    res = tmp_path / "res"
    for cutoff in (None, 0.8):
        run = _run("canopy", 10, 2, [1.0, 0.5, 0.0, 1.0], [100, 120, 80, 90])
        run["spec"]["refinement"] = {"mode": "hybrid", "share": 0.4, "cutoff": cutoff}
        write_json(res / f"{cutoff}" / "canopy.json", run)
    write_report(res)
    md = (res / "pareto.md").read_text()
    assert "### tiny, given setting, hybrid 0.4: reader tokens" in md
    assert "### tiny, given setting, hybrid 0.4, cutoff 0.8: reader tokens" in md
    assert (res / "pareto_tiny_given_hybrid0.4_cutoff0.8.png").exists()


def test_pareto_shows_short_answers_with_their_own_n(tmp_path):
    res = tmp_path / "res"
    run = _run("canopy", 10, 2, [1.0, 0.5, 0.0, 1.0], [100, 120, 80, 90], informative=(1.0, 0.0, 1.0, None))
    for r, short in zip(run["records"], (None, 0.0, 1.0, None)):  # q1, q2: informative, short answers
        r["answer_recall_short"] = short
    run["aggregate"] = aggregate(run["records"])
    write_json(res / "a.json", run)
    write_report(res)
    md = (res / "pareto.md").read_text()
    header = "| method | n | reader tokens | answer recall | n_inf | answer recall, informative | n_short | short answers |"
    assert header in md and "title and a table's header row left out" in md
    # n_inf 3 at 0.667, then n_short 2 at 0.500
    assert "| 3 | 0.667 [0.000, 1.000] | 2 | 0.500 [0.000, 1.000] |" in md
