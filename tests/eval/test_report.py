"""The report: a folder of run JSONs -> markdown tables (ablation with intervals, paired
differences, latency, sweep) and two PNG plots."""

import json

from canopy_ray.eval.report import main, write_report
from canopy_ray.core.files import write_json
from canopy_ray.eval.runs import aggregate

SHIPPED = "hybrid share=0.4 cutoff=0.8 bm25=0.4 title=0.1 link=0.2"  # the configured policy of the runs
LABEL = f"given setting, {SHIPPED}"
SLUG = "given_hybrid_share0.4_cutoff0.8_bm250.4_title0.1_link0.2"


def _run(method, k, b, f1s, tokens, roles=None, informative=(1.0, 1.0, None, None), kept=(1.0, 1.0, 1.0, 1.0),
         policy=SHIPPED):
    recs = [{"id": f"q{i}", "f1": f, "em": float(f == 1.0), "answer_kept": a, "answer_recall": 1.0,
             "answer_recall_informative": inf, "tokens": t, "llm_calls": 2, "rounds": 1, "latency_total": 1.5}
            for i, (f, t, inf, a) in enumerate(zip(f1s, tokens, informative, kept))]
    run = {"spec": {"dataset": "tiny", "method": method, "setting": "given", "k": k, "branching": b,
                    "n_questions": len(recs), "node_adapter": "frozen", "llm_model": "scripted",
                    "refinement": {"policy": policy, "margin": 0.08}},
           "aggregate": aggregate(recs), "errors": 0, "records": recs}
    if roles:
        run["point"] = {"roles": roles}
    return run


def test_report_writes_tables_and_plots(tmp_path):
    res = tmp_path / "res"
    write_json(res / "points" / "a.json", _run("shipped", 10, 2, [1.0, 0.5, 0.0, 1.0], [100, 120, 80, 90],
                                               ["ablation", "grid"]))
    write_json(res / "points" / "b.json", _run("vanilla", 10, 2, [1.0, 0.0, 0.0, 1.0], [300, 320, 280, 290],
                                               ["ablation", "grid"]))
    write_json(res / "points" / "c.json", _run("shipped", 5, 2, [0.5, 0.5, 0.0, 1.0], [60, 70, 50, 40], ["grid"]))
    write_json(res / "points" / "d.json", _run("shipped", 5, 3, [0.5, 0.5, 0.0, 1.0], [70, 80, 60, 50], ["grid"]))
    (res / "sweep.json").write_text(json.dumps({"spec": {}}))  # not a run: ignored
    paths = write_report(res)
    md = (res / "results.md").read_text()
    assert f"## tiny: methods ({LABEL}, k=10, B=2, 4 questions)" in md
    assert "| shipped | 0.500 [0.000, 1.000] | 0.625 [" in md  # EM then F1 with intervals
    # paired, vanilla - shipped: same EM on every question, F1 lower on one, +200 tokens on each
    assert "Paired differences, method - shipped (same 4 questions)" in md
    assert "| vanilla | 0.000 [0.000, 0.000] | -0.125 [-0.375, 0.000] |" in md and "| 200 [200, 200] |" in md
    assert f"## tiny: sweep over k and B ({LABEL}, 4 questions)" in md
    assert "| shipped | 5 | 3 |" in md and "| vanilla | 10 | any |" in md
    # the Pareto table and plot: methods at the ablation's point, shipped over k x B as a curve
    assert f"### tiny, {LABEL}: reader tokens vs answer recall (k=10, B=2)" in md
    assert "| shipped | 4 | 98 [" in md and "| 5 | 3 | 65 [" in md
    assert (res / "pareto.md").read_text().startswith("# Reader tokens vs answer recall")
    assert (res / f"pareto_tiny_{SLUG}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("quality_vs_tokens", "tokens_by_b"):
        assert (res / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and name in paths
    assert main([str(res), "--out", str(tmp_path / "elsewhere")]) == 0
    assert (tmp_path / "elsewhere" / "results.md").exists()
    assert main([str(tmp_path / "missing")]) == 2


def test_pareto_compares_with_no_projection_and_keeps_the_ablation_point(tmp_path):
    res = tmp_path / "res"
    write_json(res / "a.json", _run("shipped", 10, 2, [1.0, 0.5, 0.0, 1.0], [100, 120, 80, 90],
                                    informative=(1.0, 0.0, None, None), kept=(1.0, 0.0, 1.0, None)))
    write_json(res / "b.json", _run("no_projection", 10, 2, [1.0, 0.0, 0.0, 1.0], [200, 240, 160, 180],
                                    informative=(1.0, 1.0, None, None), kept=(1.0, 1.0, 1.0, None)))
    write_json(res / "c.json", _run("random", 10, 2, [0.0, 0.0, 0.0, 1.0], [100, 118, 80, 90]))
    write_json(res / "d.json", _run("shipped", 20, 3, [0.0, 0.0, 0.0, 1.0], [50, 50, 50, 50]))
    write_report(res)
    md = (res / "results.md").read_text()
    # shipped uses half of no_projection's tokens, keeps the answer of two of the three questions
    # the whole items answer (n_ans 3) and of one of the two informative questions (n_inf 2), where
    # no_projection keeps every one; the k=20 point is in the curve, not the ablation
    assert ("| shipped | 4 | 98 [85, 112] | 3 | 0.667 [0.000, 1.000] | 1.000 [1.000, 1.000] | 2 | "
            "0.500 [0.000, 1.000] |") in md
    # tokens, Δanswer kept and Δinformative against no_projection; none against itself
    assert "| -50.0% | -0.333 [-1.000, 0.000] | -0.500 [-1.000, 0.000] | - | - |" in md
    assert "| no_projection | 4 | 195 [" in md and "| 3 | 1.000 [1.000, 1.000] | 1.000 [1.000, 1.000] | 2 | 1.000 [" in md
    # no_projection - shipped: Δanswer kept, then Δevidence recall (undefined here)
    assert "| +0.0% | - | - | 0.333 [0.000, 1.000] | - |" in md
    ablation = md.split("## tiny: methods")[1].split("Paired differences")[0]
    assert ablation.count("| shipped |") == 1 and "| random |" in ablation


def test_runs_of_another_configured_margin_are_another_operating_point(tmp_path):
    res = tmp_path / "res"
    for margin, tokens in (("0", [100, 120, 80, 90]), ("0.05", [180, 200, 160, 170])):
        for method in ("shipped", "no_projection"):
            run = _run(method, 10, 2, [1.0, 0.5, 0.0, 1.0], tokens if method == "shipped" else [200] * 4,
                       policy=f"canopy margin={margin}")
            write_json(res / margin / f"{method}.json", run)
    write_report(res)
    md = (res / "pareto.md").read_text()
    # one table each, never the two margins' shipped runs in one
    assert "### tiny, given setting, canopy margin=0: reader tokens vs answer recall" in md
    assert "### tiny, given setting, canopy margin=0.05: reader tokens vs answer recall" in md
    assert (res / "pareto_tiny_given_canopy_margin0.05.png").exists()
    assert (res / "pareto_tiny_given_canopy_margin0.png").exists()
    assert md.count("| shipped | 4 | 98 [") == 1 and md.count("| shipped | 4 | 178 [") == 1


def test_hybrid_runs_are_named_by_their_policy_text(tmp_path):
    res = tmp_path / "res"
    for policy in ("hybrid share=0.4", "hybrid share=0.4 cutoff=0.8"):
        run = _run("shipped", 10, 2, [1.0, 0.5, 0.0, 1.0], [100, 120, 80, 90], policy=policy)
        write_json(res / policy.replace(" ", "_") / "shipped.json", run)
    write_report(res)
    md = (res / "pareto.md").read_text()
    assert "### tiny, given setting, hybrid share=0.4: reader tokens" in md
    assert "### tiny, given setting, hybrid share=0.4 cutoff=0.8: reader tokens" in md
    assert (res / "pareto_tiny_given_hybrid_share0.4.png").exists()
    assert (res / "pareto_tiny_given_hybrid_share0.4_cutoff0.8.png").exists()


def test_pareto_shows_short_answers_with_their_own_n(tmp_path):
    res = tmp_path / "res"
    run = _run("shipped", 10, 2, [1.0, 0.5, 0.0, 1.0], [100, 120, 80, 90], informative=(1.0, 0.0, 1.0, None))
    for r, short in zip(run["records"], (None, 0.0, 1.0, None)):  # q1, q2: informative, short answers
        r["answer_recall_short"] = short
    run["aggregate"] = aggregate(run["records"])
    write_json(res / "a.json", run)
    write_report(res)
    md = (res / "pareto.md").read_text()
    header = ("| method | n | reader tokens | n_ans | answer kept | answer recall | n_inf | answer recall, informative "
              "| n_short | short answers |")
    assert header in md and "title and a table's header row left out" in md
    # n_inf 3 at 0.667, then n_short 2 at 0.500
    assert "| 3 | 0.667 [0.000, 1.000] | 2 | 0.500 [0.000, 1.000] |" in md
