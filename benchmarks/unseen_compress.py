"""Held-out HotpotQA questions through a real ``/v1/compress`` with ``explain``: one round of
Algorithm 1 (``refinement: canopy``, margin 0, whatever the server's default) over each
question's 10 candidate paragraphs, f0 against f_theta.

For every item returned, the decisions are recomputed on the client from the returned scores
with ``canopy_ray.core.refine.decisions`` (Algorithm 1) and must match the server's, and the kept
spans must be the nodes marked kept: any difference is counted as a rule violation. Reported per
node encoder: answer recall in the compressed evidence against the whole candidates, and tokens
before / after (the server's counter).

    python benchmarks/unseen_compress.py --n 124 --out results/bench/unseen_compress.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from floor import SHARED, free_port, start  # noqa: E402

ENCODERS = ("frozen", "tuned")


def held_out_questions(n: int | None) -> list[tuple[object, list[dict]]]:
    """``(question, its candidate items)`` for the test split of the shared HotpotQA dev set."""
    from canopy_ray.core.items import parse_question
    from canopy_ray.core.splits import in_split, sample_questions
    from canopy_ray.data.sets import prepare_shared

    if not (SHARED / "hotpotqa").is_dir():
        raise SystemExit(f"needs the shared HotpotQA data at {SHARED}")
    d = prepare_shared(SHARED, Path("runs/bench-data"), ["hotpotqa"])["hotpotqa"]
    items = {o["id"]: o for o in map(json.loads, (d / "corpus.jsonl").read_text().splitlines())}
    qs = [parse_question(json.loads(line)) for line in (d / "questions.jsonl").read_text().splitlines()]
    qs = [q for q in in_split(qs, "test") if q.candidates
          and all(c in items for c in q.candidates)]
    return [(q, [items[c] for c in q.candidates]) for q in sample_questions(qs, n or len(qs))]


def violations(tree, out: dict, margin: float) -> int:
    """0 when the server's decisions and kept spans are Algorithm 1's on its own scores."""
    from canopy_ray.core.refine import KEPT, decisions

    scores = {tuple(n["span"]): n["score"] for n in out["nodes"] if n["score"] is not None}
    want = decisions(tree.root, scores, margin)
    got = {tuple(n["span"]): n["decision"] for n in out["nodes"]}
    kept = sorted(s for s, d in want.items() if d == KEPT)
    return int(got != want) + int(sorted(tuple(s) for s in out["kept"]) != kept)


def run(url: str, questions, branching: int) -> dict:
    from canopy_ray.core.evidence import piece
    from canopy_ray.core.hierarchy import build_tree
    from canopy_ray.core.items import parse_item
    from canopy_ray.core.metrics import answer_recall

    rows = {e: {"recall": 0.0, "whole_recall": 0.0, "before": 0, "after": 0, "violations": 0,
                "items": 0} for e in ENCODERS}
    with httpx.Client(timeout=600) as client:
        for q, objs in tqdm(questions, desc="questions"):
            trees = [build_tree(parse_item(o), branching) for o in objs]
            whole = "\n".join(piece(t, [t.root.span]).text for t in trees)
            for enc in ENCODERS:
                r = client.post(url + "/v1/compress", json={"query": q.question, "items": objs, "explain": True,
                                                            "node_encoder": enc, "policy": "canopy margin=0"})
                r.raise_for_status()
                out, row = r.json(), rows[enc]
                res = out["items"]
                row["recall"] += answer_recall("\n".join(x["evidence"] for x in res), q.answers)
                row["whole_recall"] += answer_recall(whole, q.answers)
                row["before"] += sum(x["tokens_before"] for x in res)
                row["after"] += sum(x["tokens_after"] for x in res)
                row["violations"] += sum(violations(t, x, out["margin"]) for t, x in zip(trees, res))
                row["items"] += len(res)
    return rows


def table(rows: dict, n: int) -> str:
    lines = [f"HotpotQA test split, {n} questions x 10 candidates, one `/v1/compress` round "
             "(explain, Algorithm 1 at margin 0) per question and node encoder", "",
             "| node encoder | answer recall, whole | answer recall, compressed | tokens before, per question | "
             "tokens after | token cut | items | rule violations |", "|---|---|---|---|---|---|---|---|"]
    for enc, r in rows.items():
        lines.append(f"| {'f0' if enc == 'frozen' else 'f_theta'} | {r['whole_recall'] / n:.3f} | "
                     f"{r['recall'] / n:.3f} | {r['before'] / n:,.0f} | {r['after'] / n:,.0f} | "
                     f"{1 - r['after'] / r['before']:.1%} | {r['items']} | {r['violations']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=None, help="questions (default: the whole test split)")
    p.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = p.parse_args(argv)
    import ray
    from ray import serve

    from canopy_ray.config import load_config

    questions = held_out_questions(args.n)
    cfg = load_config("configs/cpu.yaml", serve={"port": free_port()})
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        rows = run(start(cfg), questions, cfg.hierarchy.branching)
        serve.shutdown()
    finally:
        ray.shutdown()
    text = table(rows, len(questions))
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if all(r["violations"] == 0 for r in rows.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
