"""Compression policies compared on the given setting, chosen on validation, reported on test.

Every node of every candidate item is scored once per question and split (cosine with f_theta
and with f0, and BM25 within the question's candidates), cached under ``--work``; then each
policy is replayed from those scores. A policy's row holds the reader's evidence tokens
against passing every item whole (``no_projection``) and the informative body answer recall
(:func:`canopy_ray.core.metrics.answer_recall` of :func:`canopy_ray.core.evidence.evidence_body`,
on the questions :func:`canopy_ray.core.metrics.informative` admits), with paired 95% intervals.

Policies, over the scores ``tuned`` (f_theta), ``f0`` (frozen) or either ``+bm25:w`` (plus w
times BM25 scaled to [0, 1] within the question); ``tuned+bm25:0.8+prf:w`` adds w times BM25 of
the question expanded by the best leaf of each of the two best items (pseudo-relevance feedback,
for the second hop of a multi-hop question); ``tuned+bm25:0.4+len:beta`` adds beta times the log
of the node's words (:func:`log_words`); ``tuned+bm25:0.4+link:w`` adds w to every node of an item
that one of the two best items names (``link1``: the best one; :func:`link_terms`); ``qlink``
reads the items the question names by title too (as ``refinement.link``: a bridge question's first
paragraph names the second, wherever it ranks); ``+title:w`` adds w to every node of an item the
question names by title (:func:`canopy_ray.core.lexical.titled`, as ``refinement.title``; before
the link term, it lifts that first paragraph among the best items); with ``--cross DIR`` also
``cross`` (the cross-encoder node scorer of :mod:`canopy_ray.train.cross`, a probability) alone,
with BM25, added to ``tuned+bm25:0.8``, and added to ``tuned+bm25:0.4+link:0.2`` and to
``tuned+bm25:0.4+title:0.1+link:0.2`` (the link term then ranks items by the sum, as
``refinement.cross`` and ``refinement.link`` do together; these rows read the two best items only,
so a config with a cross-encoder matches no row):

- ``canopy m``: Algorithm 1 at margin m (:func:`canopy_ray.core.refine.refine`);
- ``gate m/d``: refinement at margin m, then an item whose best visited node scores below the
  question's best item's by more than d is left out (``gate-leaf m/d``: cut to its best leaf);
- ``hybrid r`` (``hybrid r/e``): the paper's remedy for flat selection's precision: the top r share
  of all the question's leaves ranked globally, each then raised to its parent while the parent
  scores at least as high (or less than e below: its uncertainty fallback), so the parent-child
  rule decides the stopping depth (:func:`canopy_ray.core.refine.hybrid`); ``lead r``: the same,
  and an item with a chosen leaf keeps its first one too;
- ``flat r``: the same top r share of leaves, not raised (flat selection at that budget);
- ``cut d`` (``cut d/r``): the leaves scoring within d of the question's best leaf (among the top r
  share), raised as the hybrid's: a budget that follows how clearly the question's best evidence
  stands out instead of a fixed share (``refinement.cutoff``).

A second table gives each scorer's decision accuracy and gold recall on the questions' gold
items (:func:`gold_stats`). Tables follow the rules classifier (aggregation tables whole), as
``critic.table_classifier: rules``. Run ``python -m canopy_ray.eval.study --split validation``
and ``--split test`` (two processes; the second to finish writes ``results/study/study.md`` and
``.json``) on the sets ``canopy data convert`` wrote to ``runs/data`` (``scripts/reproduce_eval.sh``
step 1).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from canopy_ray.core.evidence import evidence_body, head, node_text, piece, render_evidence
from canopy_ray.core.files import digest
from canopy_ray.core.hierarchy import ItemTree, Span, build_tree
from canopy_ray.core.items import TableItem
from canopy_ray.core.lexical import best_of, bm25, named, scaled, titled
from canopy_ray.core.metrics import answer_recall, bootstrap_ci, informative, paired_difference_ci, refinement_stats
from canopy_ray.core.refine import drive, gate, hybrid, refine, score_lazily, top_leaves
from canopy_ray.core.table_rules import table_kind

SETS = ("hotpotqa", "nq", "tatqa")


def trees_of(question, items) -> list[ItemTree]:
    out = []
    for c in question.candidates:
        it = items[c]
        whole = isinstance(it, TableItem) and table_kind(question.question) == "aggregation"
        out.append(build_tree(it, whole=whole))
    return out


def score_set(eval_set, encoder, path: Path) -> list[dict]:
    """Per question: every node's cosine with f_theta (``tuned``) and with f0 (``f0``) and its
    BM25 score (cached as JSON at ``path``)."""
    if path.is_file():
        return json.loads(path.read_text())
    from tqdm import tqdm

    from canopy_ray.models.encoder import frozen_nodes

    out, encoders = [], {"tuned": encoder, "f0": frozen_nodes(encoder)}
    cache: dict = {name: {} for name in encoders}  # node text -> vector: questions share passages and reports

    def vecs(pieces, name):
        enc, vectors = encoders[name], cache[name]
        new = list({p.text: p for p in pieces if p.text not in vectors}.values())
        if new:
            for p, v in zip(new, enc.encode_nodes(new)):
                vectors[p.text] = v
        return np.stack([vectors[p.text] for p in pieces])

    for q in tqdm(eval_set.questions, desc=path.stem):
        trees = trees_of(q, eval_set.items)
        nodes = [(i, n.span) for i, t in enumerate(trees) for n in t.nodes()]
        pieces = [piece(trees[i], [s]) for i, s in nodes]
        qv = encoder.encode_queries([q.question])[0]
        lex = bm25(q.question, [p.text for p in pieces])
        out.append({"id": q.id, "nodes": [[i, list(s)] for i, s in nodes], "bm25": lex,
                    **{name: (vecs(pieces, name) @ qv).tolist() for name in encoders}})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    return out


def cross_scores(questions, trees_per_question, recs: list[dict], scorer, path: Path) -> None:
    """Adds the cross-encoder's score of every node to each question's record (cached at ``path``)."""
    if not path.is_file():
        from tqdm import tqdm

        out = []
        for q, trees, rec in zip(tqdm(questions, desc=path.stem), trees_per_question, recs):
            out.append(scorer.score(q.question, [node_text(trees[i], tuple(s)) for i, s in rec["nodes"]]).tolist())
        path.write_text(json.dumps(out))
    for rec, s in zip(recs, json.loads(path.read_text()), strict=True):
        rec["cross"] = s


def feedback(question: str, trees: list[ItemTree], rec: dict, items: int = 2) -> list[float]:
    """BM25 (scaled) of every node against the question plus the text of the best leaf (by
    ``tuned+bm25:0.8``) of each of the ``items`` best items."""
    scores = node_scores(rec, "tuned+bm25:0.8", len(trees))
    best = [max((n.span for n in t.nodes() if n.is_leaf), key=sc.__getitem__) for t, sc in zip(trees, scores)]
    top = sorted(range(len(trees)), key=lambda i: -scores[i][best[i]])[:items]
    return scaled(bm25(" ".join([question] + [node_text(trees[i], best[i]) for i in top]),
                       [node_text(trees[i], tuple(span)) for i, span in rec["nodes"]]))


def item_texts(trees: list[ItemTree], rec: dict) -> dict:
    """What :func:`link_terms` reads: the items' titles and bodies, and which nodes are leaves (a
    single-node item's root is its leaf)."""
    leaves = [{n.span for n in t.nodes() if n.is_leaf} for t in trees]
    return {"titles": [t.item.title for t in trees], "bodies": [piece(t, [t.root.span]).body for t in trees],
            "leaf": [tuple(span) in leaves[i] for i, span in rec["nodes"]]}


def link_terms(rec: dict, s: np.ndarray, items: int, also=()) -> list[float]:
    """1 for every node of an item that one of the ``items`` best items (by ``s``, their best leaf)
    or of ``also`` names (:func:`canopy_ray.core.lexical.named`), else 0."""
    best = best_of(len(rec["titles"]), ((i, v) for (i, _), v, leaf in zip(rec["nodes"], s, rec["leaf"]) if leaf))
    hit = named(rec["titles"], rec["bodies"].__getitem__, best, items, also)
    return [float(hit[i]) for i, _ in rec["nodes"]]


def title_terms(rec: dict) -> list[float]:
    """1 for every node of an item the question names by title (``rec["titled"]``), else 0."""
    return [float(i in rec["titled"]) for i, _ in rec["nodes"]]


def prepared(name: str, split: str, data: Path, work: Path, encoder) -> tuple:
    """A data set's split, every node scored (cached at ``work`` under the encoder's identity:
    another adapter scores afresh), its trees (built once: every policy replays them) and the
    terms :func:`node_scores` adds."""
    from canopy_ray.eval.runs import load_eval_set

    d = data / name
    es = load_eval_set(name, d / "questions.jsonl", d / "corpus.jsonl", split=split)
    recs = score_set(es, encoder, work / f"{name}-{split}-{digest([encoder.model_id, encoder.adapter_id], 12)}.json")
    trees = [trees_of(q, es.items) for q in es.questions]
    for q, ts, rec in zip(es.questions, trees, recs):
        rec["prf"], rec["len"] = feedback(q.question, ts, rec), log_words(ts, rec)
        rec.update(item_texts(ts, rec))
        rec["titled"] = [i for i, hit in enumerate(titled(rec["titles"], q.question)) if hit]
        rec["title"] = title_terms(rec)
    return es, trees, recs


def log_words(trees: list[ItemTree], rec: dict) -> list[float]:
    """log(words) of every node's text: ``+len:beta`` lets a (longer) parent win more of its
    comparisons with its children when beta > 0, and fewer when beta < 0."""
    return [math.log(max(1, len(node_text(trees[i], tuple(span)).split()))) for i, span in rec["nodes"]]


def node_scores(rec: dict, scorer: str, n_items: int) -> list[dict[Span, float]]:
    """``base+name:w+...``: the base score plus w times each named one (BM25 scaled to [0, 1])."""
    base, *terms = scorer.split("+")
    s = np.asarray(rec[base], float)
    for term in terms:
        name, _, w = term.partition(":")
        if name.startswith("link"):  # the items the best ones (by the terms before it) name
            term = link_terms(rec, s, int(name[4:] or 2))
        elif name == "qlink":  # and those the items the question names by title name
            term = link_terms(rec, s, 2, rec["titled"])
        else:
            term = scaled(rec["bm25"]) if name == "bm25" else rec[name]
        s = s + float(w) * np.asarray(term, float)
    out: list[dict[Span, float]] = [{} for _ in range(n_items)]
    for (i, span), v in zip(rec["nodes"], s):
        out[i][tuple(span)] = float(v)
    return out


def visited_best(tree: ItemTree, sc: dict[Span, float], margin: float) -> float:
    """The best score among the nodes Algorithm 1 visits (all a lazy scorer knows)."""
    seen = drive(score_lazily([tree.root], margin), lambda ask: [sc[n.span] for _, n in ask])[0]
    return max(seen.values()) if seen else sc[tree.root.span]


def apply(policy: str, trees: list[ItemTree], scores: list[dict[Span, float]]) -> list[list[Span]]:
    """Kept spans per item (empty: the item is left out)."""
    name, _, arg = policy.partition(" ")
    if name in ("canopy", "gate", "gate-leaf"):
        m, _, d = arg.partition("/")
        kept = [refine(t.root, sc, float(m)) if t.root.children else [t.root.span] for t, sc in zip(trees, scores)]
        if name == "canopy":
            return kept
        stay = gate([visited_best(t, sc, float(m)) for t, sc in zip(trees, scores)], float(d))
        leaf = [[max((n.span for n in t.nodes() if n.is_leaf), key=lambda s: sc[s])] for t, sc in zip(trees, scores)]
        return [k if ok else (b if name == "gate-leaf" else []) for k, ok, b in zip(kept, stay, leaf)]
    if name in ("hybrid", "lead"):  # "hybrid share" or "hybrid share/fallback"
        share, _, fb = arg.partition("/")
        return hybrid([t.root for t in trees], scores, float(share), float(fb or 0), lead=name == "lead")
    if name == "cut":  # "cut d" or "cut d/share"
        d, _, share = arg.partition("/")
        return hybrid([t.root for t in trees], scores, float(share or 1), cutoff=float(d))
    if name == "flat":  # the same leaves as the hybrid chooses, not raised
        chosen = top_leaves([t.root for t in trees], scores, float(arg))
        return [sorted(c) if t.root.children else [t.root.span] for t, c in zip(trees, chosen)]
    raise ValueError(f"unknown policy {policy!r}")


def gold_stats(question, trees: list[ItemTree], scores: list[dict[Span, float]], kept: list[list[Span]]) -> list:
    """:class:`~canopy_ray.core.metrics.RefinementStats` of the question's gold items with located
    leaves and a hierarchy (an aggregation table kept whole has none), as ``canopy eval-refinement``
    counts them on gold items alone: the scorer's preferences hold or not (decision accuracy), and
    the policy kept a gold leaf or not (gold recall; an item left out keeps none)."""
    gold = {g.item_id: g.leaves for g in question.gold if g.leaves}
    out = []
    for c, t, sc, k in zip(question.candidates, trees, scores, kept):
        leaves = [i for i in gold.get(c, ()) if i < t.n_leaves]
        if leaves and t.root.children:
            out.append(refinement_stats(t.root, sc, k, leaves))
    return out


def evaluate(policy: str, scorer: str, questions, trees_per_question, recs: list[dict], count) -> list[dict]:
    rows = []
    for q, trees, rec in zip(questions, trees_per_question, recs):
        scores = node_scores(rec, scorer, len(trees))
        kept = [[t.root.span] for t in trees] if policy == "whole" else apply(policy, trees, scores)
        pieces = [piece(t, k) for t, k in zip(trees, kept) if k]
        useful = bool(q.answers) and informative(q.answers, [head(t.item) for t in trees])
        rows.append({"tokens": count(render_evidence(pieces)),
                     "recall": answer_recall(evidence_body(pieces), q.answers) if useful else None,
                     "gold": gold_stats(q, trees, scores, kept)})
    return rows


def summary(rows: list[dict], whole: list[dict]) -> dict:
    tok = np.array([r["tokens"] for r in rows], float)
    base = np.array([r["tokens"] for r in whole], float)
    pairs = [(r["recall"], w["recall"]) for r, w in zip(rows, whole) if r["recall"] is not None]
    rec = [a for a, _ in pairs]
    r, d = bootstrap_ci(rec), paired_difference_ci(rec, [b for _, b in pairs])
    gold = [g for row in rows for g in row["gold"]]
    return {"tokens": float(tok.mean()), "saved": float(1 - tok.sum() / base.sum()),
            "recall": r.mean, "recall_ci": [r.low, r.high],
            "delta": d.mean, "delta_ci": [d.low, d.high], "n": len(rows), "n_inf": len(rec),
            # micro counts, pooled over the sets by the decisions table
            "preferences": [sum(g.pref_correct for g in gold), sum(g.pref_nodes for g in gold)],
            "gold_leaves": [sum(g.gold_kept for g in gold), sum(g.gold_leaves for g in gold)]}


SCORERS = ("f0", "f0+bm25:0.4",
           "tuned", "tuned+bm25:0.2", "tuned+bm25:0.4", "tuned+bm25:0.8", "tuned+bm25:1.2", "tuned+bm25:1.6",
           "tuned+bm25:0.8+prf:0.2", "tuned+bm25:0.8+prf:0.4", "tuned+bm25:0.8+prf:0.8",
           "tuned+bm25:0.4+len:-0.04", "tuned+bm25:0.4+len:-0.02", "tuned+bm25:0.4+len:0.02", "tuned+bm25:0.4+len:0.04",
           "tuned+bm25:0.4+link1:0.2", "tuned+bm25:0.4+link:0.1", "tuned+bm25:0.4+link:0.2", "tuned+bm25:0.4+link:0.4",
           "tuned+bm25:0.4+title:0.1", "tuned+bm25:0.4+title:0.1+link:0.2", "tuned+bm25:0.4+title:0.2+link:0.2",
           "tuned+bm25:0.4+title:0.4+link:0.2",
           "tuned+bm25:0.4+qlink:0.2", "tuned+bm25:0.4+title:0.1+qlink:0.2", "tuned+bm25:0.4+title:0.2+qlink:0.2")
CROSS = ("cross", "cross+bm25:0.2", "cross+bm25:0.4", "cross+bm25:0.8",
         "tuned+bm25:0.8+cross:0.2", "tuned+bm25:0.8+cross:0.4",
         "tuned+bm25:0.4+cross:0.2+link:0.2", "tuned+bm25:0.4+cross:0.4+link:0.2",
         "tuned+bm25:0.4+cross:0.2+title:0.1+link:0.2")
POLICIES = (["canopy 0", "canopy 0.05"] + [f"{g} 0.05/{d}" for g in ("gate", "gate-leaf") for d in (0.1, 0.2)]
            + [f"{p} {r}" for p in ("hybrid", "lead", "flat") for r in (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6)]
            + ["hybrid 0.4/0.02", "hybrid 0.5/0.02", "lead 0.4/0.02", "lead 0.5/0.02"]
            + [f"cut {d}" for d in (0.4, 0.5, 0.6)] + [f"cut {d}/0.4" for d in (0.8, 0.9, 1)])
# Within these of passing items whole (informative body answer recall, points): the bar
TOLERANCE = {"hotpotqa": 0.02, "nq": 0.02, "tatqa": 0.01}


def choose(val: dict) -> tuple[str, str]:
    """The (scorer, policy) saving the most tokens on average over the sets while every set's
    validation recall is within :data:`TOLERANCE` of whole items."""
    ok = [(np.mean([val[s][key]["saved"] for s in SETS]), key) for key in val[SETS[0]]
          if all(val[s][key]["delta"] >= -TOLERANCE[s] for s in SETS)]
    return max(ok)[1] if ok else max((np.mean([val[s][k]["delta"] for s in SETS]), k) for k in val[SETS[0]])[1]


def shipped(cfg) -> tuple[str, str]:
    """The (scorer, policy) a config's refinement runs, in this study's names."""
    r = cfg.refinement
    if r.mode == "canopy":
        return "tuned", f"canopy {cfg.margin:g}"
    scorer = "tuned" + (f"+bm25:{r.lexical:g}" if r.lexical else "") + (f"+cross:{r.cross:g}" if r.cross else "") \
        + (f"+title:{r.title:g}" if r.title else "") + (f"+qlink:{r.link:g}" if r.link else "")
    policy = f"{'lead' if r.lead else 'hybrid'} {r.share:g}" + (f"/{r.fallback:g}" if r.fallback else "")
    if r.cutoff is None:
        return scorer, policy
    # the study's cut policies are the plain hybrid's; with lead or a fallback the name matches none
    return scorer, f"{policy} cut {r.cutoff:g}" if r.lead or r.fallback else f"cut {r.cutoff:g}/{r.share:g}"


def table(results: dict, chosen: tuple[str, str], split: str, ship: tuple[str, str] | None = None) -> list[str]:
    lines = [f"### {split}", "",
             "| scorer | policy | " + " | ".join(f"{s} saved | {s} recall [95%] | {s} Δ vs whole [95%]" for s in SETS)
             + " |", "|---|---|" + "---|" * (3 * len(SETS))]
    for key in results[SETS[0]]:
        cells = []
        for s in SETS:
            r = results[s][key]
            cells += [f"{100 * r['saved']:.1f}%", f"{r['recall']:.3f} [{r['recall_ci'][0]:.3f}, {r['recall_ci'][1]:.3f}]",
                      f"{100 * r['delta']:+.1f} [{100 * r['delta_ci'][0]:+.1f}, {100 * r['delta_ci'][1]:+.1f}]"]
        mark = (" **(chosen)**" if key == chosen else "") + (" **(shipped)**" if key == ship else "")
        lines.append(f"| {key[0]} | {key[1]}{mark} | " + " | ".join(cells) + " |")
    return lines


def decisions(results: dict, split: str, ship: tuple[str, str]) -> list[str]:
    """Each scorer's decision accuracy on the gold items (policy-free: its preferences) and the
    gold recall of Algorithm 1 and of the shipped policy with it, micro, pooled over the sets."""
    def pct(key, field, sets=SETS):
        counts = [results[s].get(key, {}).get(field) for s in sets]
        if None in counts:  # a row from a run before these counts were kept
            return "-"
        hit, n = (sum(c[i] for c in counts) for i in (0, 1))
        return f"{100 * hit / n:.1f}" if n else "-"

    lines = [f"### {split}: decisions on gold items", "",
             "| scorer | " + " | ".join(f"decision accuracy, {s}" for s in SETS) + " | decision accuracy, all | "
             f"gold recall, canopy 0 | gold recall, {ship[1]} |", "|---|" + "---|" * (len(SETS) + 3)]
    for scorer in dict.fromkeys(k[0] for k in results[SETS[0]]):
        a1, sh = (scorer, "canopy 0"), (scorer, ship[1])
        cells = [pct(a1, "preferences", [s]) for s in SETS] + [pct(a1, "preferences"), pct(a1, "gold_leaves"),
                                                              pct(sh, "gold_leaves")]
        if set(cells) != {"-"}:
            mark = " **(shipped)**" if scorer == ship[0] else ""
            lines.append(f"| {scorer}{mark} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="runs/data", help="converted sets (canopy data convert)")
    ap.add_argument("--work", default="runs/study", help="cached node scores")
    ap.add_argument("--out", default="results/study")
    ap.add_argument("--config", default=None)
    ap.add_argument("--adapter", default=None, help="f_theta's adapter (default: the config's); give it its own --work")
    ap.add_argument("--cross", default=None, help="a cross-encoder scorer (canopy_ray.train.cross): adds the "
                    "scorers that use it (CROSS)")
    ap.add_argument("--split", choices=["validation", "test"], default=None,
                    help="score and replay one split only (two processes in parallel); the tables are "
                         "written once both splits' results are in --work")
    ap.add_argument("--tables", action="store_true", help="only write the tables from the results in --work")
    args = ap.parse_args(argv)
    from canopy_ray.config import load_config
    from canopy_ray.models.encoder import build_encoder
    from canopy_ray.models.llm.tokens import token_counter

    cfg = load_config(args.config, **({"models": {"adapter": args.adapter}} if args.adapter else {}))
    encoder = build_encoder(cfg.models)
    count = token_counter(cfg.llm)
    cross = None
    if args.cross:
        from canopy_ray.models.cross import CrossScorer

        cross = CrossScorer(args.cross, max_length=cfg.models.max_length)
    scorers = {"tuned": f"{encoder.model_id}:{encoder.adapter_id}", "cross": cross.adapter_id if cross else None}
    work = Path(args.work)
    for split in [] if args.tables else [args.split] if args.split else ["validation", "test"]:
        res = {}
        for s in SETS:
            es, trees, recs = prepared(s, split, Path(args.data), work, encoder)
            if cross is not None:  # cached under its identity too
                cross_scores(es.questions, trees, recs, cross, work / f"{s}-{split}-{cross.adapter_id.replace(':', '-')}.json")
            whole = evaluate("whole", "tuned", es.questions, trees, recs, count)
            res[s] = [{"scorer": sc, "policy": p, **summary(evaluate(p, sc, es.questions, trees, recs, count), whole)}
                      for sc in SCORERS + (CROSS if cross else ()) for p in POLICIES]
            print(f"{split} {s}: {len(es.questions)} questions", flush=True)
        (work / f"results-{split}.json").write_text(json.dumps({"scorers": scorers, "sets": res}))
    if not all((work / f"results-{split}.json").is_file() for split in ("validation", "test")):
        return 0
    saved = {split: json.loads((work / f"results-{split}.json").read_text()) for split in ("validation", "test")}
    for split, got in saved.items():  # both splits' tables from the scorers asked for now
        if got.get("scorers") != scorers:
            print(f"error: {work / f'results-{split}.json'} was replayed with scorers "
                  f"{got.get('scorers', '(not recorded)')}, not {scorers}: replay it (--split {split}) or give "
                  "its --adapter / --cross", file=sys.stderr)
            return 2
    results = {split: {s: {(r["scorer"], r["policy"]): r for r in rows} for s, rows in got["sets"].items()}
               for split, got in saved.items()}
    chosen, ship = choose(results["validation"]), shipped(cfg)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Compression policies on the given setting (k = 10, B = 2, reader tokens of SmolLM2)", "",
             "Made by `python -m canopy_ray.eval.study` (module docstring: the policies). Chosen on validation: "
             "the most tokens saved on average over the three sets with every set's informative body answer "
             f"recall within {', '.join(f'{s} {100 * t:.0f}' for s, t in TOLERANCE.items())} points of whole items; "
             f"chosen: **{chosen[0]} / {chosen[1]}**; shipped by the config: **{ship[0]} / {ship[1]}** "
             f"(`tuned`: f_theta, adapter `{encoder.adapter_id}`) "
             "(docs/evaluation.md says why they differ when they do). Saved: reader tokens against whole items. "
             "Δ: paired difference in informative body answer recall against whole items, points.", ""]
    for split in ("validation", "test"):
        lines += table(results[split], chosen, split, ship) + [""]
    lines += ["Decision accuracy: the share of a gold item's preference nodes (`canopy_ray.core.pairs`) whose every "
              "preference the scorer's node scores hold, micro over the gold items with a hierarchy, BM25 scaled "
              "within the question's candidates as refinement scales it; gold recall: gold leaves kept of those "
              "items (an item left out keeps none). `canopy eval-refinement` counts the same on gold items alone.", ""]
    for split in ("validation", "test"):
        lines += decisions(results[split], split, ship) + [""]
    (out / "study.md").write_text("\n".join(lines))
    (out / "study.json").write_text(json.dumps(
        {"chosen": list(chosen), "shipped": list(ship), **{split: {s: list(r.values()) for s, r in results[split].items()}
                                    for split in results}}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
