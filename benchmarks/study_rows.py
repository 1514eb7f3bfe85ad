"""A few study rows replayed on the validation split of the given sets, from the study's cache
(runs/study, written by ``python -m canopy_ray.eval.study``): a quick look at candidates before a
full study. Validation only: nothing here reads a test question.

    python benchmarks/study_rows.py hotpotqa nq [tatqa]
"""
import sys
from pathlib import Path
from canopy_ray.config import load_config
from canopy_ray.models.encoder import build_encoder
from canopy_ray.models.llm.tokens import token_counter
from canopy_ray.eval.study import prepared, evaluate, summary, WHOLE, StudyPolicy, bridge_slice
cfg = load_config("configs/cpu.yaml"); enc = build_encoder(cfg.models); count = token_counter(cfg.llm)
S = "hybrid share=0.4 cutoff=0.8 bm25=0.4 title=0.1 link=0.2"
rows = ["oracle-sentences", "oracle-items", S, S + " bridge=0.5", S + " bridge=1",
        "hybrid share=0.3 bm25=0.4 title=0.1 link=0.2", "hybrid share=0.3 bm25=0.4 title=0.1 link=0.2 bridge=1",
        "hybrid share=1 z=1 bm25=0.4 title=0.1 link=0.2", "hybrid share=1 z=1 bm25=0.4 title=0.1 link=0.2 bridge=1",
        "hybrid share=1 z=1.5 bm25=0.4 title=0.1 link=0.2 bridge=1", "hybrid share=1 z=0.5 bm25=0.4 title=0.1 link=0.2 bridge=1"]
print("| set | policy | saved | answer kept | Δ vs whole, points | n | chained slice: n, saved, Δ |")
print("|---|---|---|---|---|---|---|")
for name in sys.argv[1:]:
    es, trees, recs = prepared(name, "validation", Path("runs/data"), Path("runs/study"), enc)
    whole = evaluate(WHOLE, "tuned", es.questions, trees, recs, count)
    sel = bridge_slice(es.questions, trees, recs) if name == "hotpotqa" else None
    for r in rows:
        got = evaluate(StudyPolicy.parse(r), "tuned", es.questions, trees, recs, count)
        a = summary(got, whole)
        line = f"| {name} | {r} | {100*a['saved']:.1f}% | {a['recall']:.3f} | {100*a['delta']:+.1f} | {a['n_ans']} |"
        if sel:
            b = summary([x for x, k in zip(got, sel) if k], [w for w, k in zip(whole, sel) if k])
            line += f" slice ({b['n_ans']}): {100*b['saved']:.1f}% {100*b['delta']:+.1f} |"
        print(line, flush=True)
