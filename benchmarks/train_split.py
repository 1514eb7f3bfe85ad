"""The shipped policy and its neighbours on the training questions: a check of how lucky the
test split was, never used to choose (f_theta was trained on these questions, so it flatters
them if anything).

Replays ``canopy_ray.eval.study``'s shipped policy, without the title term, and with the link
term reading the two best items only (``hop2``), on a data set's ``train`` split, and writes one
row each: tokens saved against whole items, the headline answer recall, its paired difference
(95% interval) and the answers lost.

    python benchmarks/train_split.py [--set hotpotqa] [--out results/study/train_split.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

POLICIES = ("hybrid share=0.4 cutoff=0.8 bm25=0.4 title=0.1 link=0.2",
            "hybrid share=0.4 cutoff=0.8 bm25=0.4 title=0.1 hop2=0.2",
            "hybrid share=0.4 cutoff=0.8 bm25=0.4 link=0.2", "hybrid share=0.4 cutoff=0.8 bm25=0.4 hop2=0.2")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--set", default="hotpotqa")
    p.add_argument("--data", default="runs/data", help="converted sets (canopy data convert)")
    p.add_argument("--work", default="runs/study", help="cached node scores, as the study's")
    p.add_argument("--config", default="configs/cpu.yaml")
    p.add_argument("--out", default="results/study/train_split.md")
    args = p.parse_args(argv)
    import canopy_ray.eval.study as st
    from canopy_ray.config import load_config
    from canopy_ray.models.encoder import build_encoder
    from canopy_ray.models.llm.tokens import token_counter

    cfg = load_config(args.config)
    encoder, count = build_encoder(cfg.models), token_counter(cfg.llm)
    es, trees, recs = st.prepared(args.set, "train", Path(args.data), Path(args.work), encoder)
    whole = st.evaluate(st.WHOLE, "tuned", es.questions, trees, recs, count)
    lines = [f"# {args.set}, train split ({len(es.questions)} questions), f_theta", "",
             f"`python benchmarks/train_split.py --set {args.set}` (adapter `{encoder.adapter_id}`, trained on these "
             "questions). Saved: reader tokens against whole items; Δ: paired difference in the headline answer "
             "recall (answer kept) against whole items, points.", "",
             "| policy | saved | answer kept [95%] | Δ vs whole [95%] | answers lost |", "|---|---|---|---|---|"]
    for policy in POLICIES:
        rows = st.evaluate(st.StudyPolicy.parse(policy), "tuned", es.questions, trees, recs, count)
        r = st.summary(rows, whole)
        lost = sum(a["recall"] is not None and a["recall"] < w["recall"] for a, w in zip(rows, whole))
        lines.append(f"| {policy} | {100 * r['saved']:.1f}% | {r['recall']:.3f} [{r['recall_ci'][0]:.3f}, "
                     f"{r['recall_ci'][1]:.3f}] | {100 * r['delta']:+.1f} [{100 * r['delta_ci'][0]:+.1f}, "
                     f"{100 * r['delta_ci'][1]:+.1f}] | {lost} of {r['n_ans']} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
