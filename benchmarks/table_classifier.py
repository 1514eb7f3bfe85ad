"""What decides TAT-QA's savings: the table classifier, measured against the data's own labels.

For the TAT-QA questions of a split (test unless ``--split``; given setting, reader skipped) whose
candidates hold a table, it compares the table classifiers of ``critic.table_classifier``:
``llm`` (the CPU SmolLM2, the paper's design), ``rules`` (:mod:`canopy_ray.core.table_rules`),
and the two forced modes, ``whole`` (every table kept whole) and ``never`` (no classifier: every
table refined). Per classifier: how often it says "aggregation", its accuracy against what TAT-QA
records (``answer_type`` count/arithmetic = needs several values; and, stricter, the gold rows
the converter located: >= 2 rows), and the shipped policy's reader tokens and answer recall
(the headline answer kept, and the body on informative questions) against ``no_projection`` on
the same questions.

    python benchmarks/table_classifier.py [--split validation] [--n N] [--out results/bench/table_classifier.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from floor import SHARED  # noqa: E402

MODES = ("llm", "rules", "whole", "never")


def raw_answer_types(path: Path) -> dict[str, str]:
    return {q["uid"]: q.get("answer_type", "") for doc in json.loads(path.read_text()) for q in doc["questions"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/cpu.yaml")
    p.add_argument("--split", choices=["validation", "test"], default="test")
    p.add_argument("--n", type=int, default=None, help="questions (default: all with a table)")
    p.add_argument("--llm-cache", default="runs/llm.sqlite")
    p.add_argument("--out", default="results/bench/table_classifier.md")
    args = p.parse_args(argv)
    if not (SHARED / "tatqa").is_dir():
        raise SystemExit(f"needs the shared TAT-QA data at {SHARED}")
    from canopy_ray.config import load_config
    from canopy_ray.core.files import write_text
    from canopy_ray.core.items import TableItem
    from canopy_ray.core.table_rules import table_kind
    from canopy_ray.data.sets import prepare_shared
    from canopy_ray.eval.cache import CachedChatClient
    from canopy_ray.eval.methods import get_method
    from canopy_ray.eval.runs import Runner, load_eval_set, paired_differences
    from canopy_ray.models.llm import client_from_config
    from canopy_ray.models.llm.roles import arun_role, table_call

    cfg = load_config(args.config)
    d = prepare_shared(SHARED, Path("runs/data"), ["tatqa"])["tatqa"]
    es = load_eval_set("tatqa", d / "questions.jsonl", d / "corpus.jsonl", split=args.split)
    es.questions = [q for q in es.questions if any(isinstance(es.items[c], TableItem) for c in q.candidates)]
    es.questions = es.questions[:args.n] if args.n else es.questions
    kinds = raw_answer_types(SHARED / "tatqa" / "tatqa_dev.json")
    client = CachedChatClient(client_from_config(cfg.llm), args.llm_cache)

    async def llm_labels():
        return [(await arun_role(client, table_call(q.question))).value for q in es.questions]

    labels = {"llm": asyncio.run(llm_labels()), "rules": [table_kind(q.question) for q in es.questions],
              "whole": ["aggregation"] * len(es.questions), "never": ["lookup"] * len(es.questions)}
    tables = {c for q in es.questions for c in q.candidates if isinstance(es.items[c], TableItem)}
    needs_values = [kinds.get(q.id) in ("arithmetic", "count") for q in es.questions]
    many_rows = [any(g.item_id in tables and len(g.leaves) >= 2 for g in q.gold) for q in es.questions]

    runner = Runner(cfg, client)
    ref = runner.run(es, get_method("no_projection"), reader=False)
    rows = []
    for mode in MODES:
        critic = {"classify_tables": mode != "never", "table_classifier": "llm" if mode == "never" else mode}
        runner.cfg = cfg.override(critic=critic)
        run = runner.run(es, get_method("shipped"), reader=False)
        diff = paired_differences(run["records"], ref["records"], ["answer_recall_informative", "answer_kept"])
        agg = [x == "aggregation" for x in labels[mode]]
        acc = lambda truth: sum(a == t for a, t in zip(agg, truth)) / len(truth)  # noqa: E731
        rows.append(f"| {mode} | {sum(agg) / len(agg):.1%} | {acc(needs_values):.1%} | {acc(many_rows):.1%} | "
                    f"{run['aggregate']['tokens']['mean']:.0f} ({run['aggregate']['tokens']['mean'] / ref['aggregate']['tokens']['mean'] - 1:+.1%}) | "
                    "{mean:+.3f} [{low:+.3f}, {high:+.3f}]".format(**diff["answer_recall_informative"]) + " | "
                    "{mean:+.3f} [{low:+.3f}, {high:+.3f}]".format(**diff["answer_kept"]) + f" | "
                    f"{run['aggregate']['evidence_recall']['mean']:.3f} |")
        print(rows[-1], flush=True)
    n_inf = diff["answer_recall_informative"]["n"]
    refinement = f"`{cfg.policy}`"
    lines = ["# TAT-QA: the table classifier against the data's labels", "",
             f"TAT-QA {args.split} questions with a table among their candidates: {len(es.questions)} "
             f"(document-level split, given setting, reader skipped; {n_inf} informative; the config's "
             f"refinement: {refinement}). "
             f"`no_projection` passes "
             f"{ref['aggregate']['tokens']['mean']:.0f} tokens. Truth: TAT-QA's `answer_type` count/arithmetic "
             f"({sum(needs_values)} questions), and >= 2 located gold rows ({sum(many_rows)}). Δ: the shipped policy minus "
             "no_projection, paired, 95% bootstrap interval. `python benchmarks/table_classifier.py"
             + (f" --split {args.split} --out {args.out}`" if args.split != "test" else "`"), "",
             "| classifier | says aggregation | accuracy vs count/arithmetic | accuracy vs >= 2 gold rows | "
             "reader tokens (vs no_projection) | Δanswer recall, informative (titles aside) | Δanswer kept | evidence recall |",
             "|---|---|---|---|---|---|---|---|", *rows, ""]
    write_text(args.out, "\n".join(lines))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
