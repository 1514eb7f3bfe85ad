"""Compression policies compared on the given setting, chosen on validation, reported on test.

Every node of every candidate item is scored once per question and split (cosine with f_theta
and with f0, and BM25 within the question's candidates), cached under ``--work``; then each
policy is replayed from those scores through the compressor's own composition
(:func:`canopy_ray.core.scoring.compose`) and selection (:meth:`canopy_ray.core.policy.Policy.keep`).
A row is (base scorer, policy): ``tuned`` (f_theta), ``f0`` (frozen) or, with ``--cross DIR``,
``cross`` (the cross-encoder node scorer of :mod:`canopy_ray.train.cross`, a probability), and a
policy in the text form of ``refinement.policy``. It holds the reader's evidence tokens against
passing every item whole (``whole``) and the headline answer recall
(:func:`canopy_ray.core.metrics.kept_answer`: an answer in the kept evidence, kept items' titles
included, over the questions whose items hold one), with paired 95% intervals, and the
titles-aside figure (body answer recall on the :func:`~canopy_ray.core.metrics.informative` questions).

The study also tries what no product config runs (:data:`STUDY_KEYS`), in its own policy text:
``gate margin=M below=D`` (Algorithm 1, then an item whose best visited node scores more than D
below the best item's is left out; ``gate-leaf``: cut to its best leaf), ``lead share=S`` (the
hybrid, and an item with a chosen leaf keeps its first one too), ``fallback=E`` (a chosen node
also rises when its parent scores less than E below it), ``prf=W`` (BM25 of the question
expanded by the best leaf of each of the two best items), ``len=B`` (B times the log of a node's
words) and ``hop1=W`` / ``hop2=W`` (the link term from the best item, or the two best, without
the items the question names).

Chosen on validation by :func:`choose`; ``--write-config FILE`` writes the pick into a config's
``refinement.policy`` (``scripts/reproduce_eval.sh`` writes ``configs/cpu.yaml``). A second table
gives each scorer's decision accuracy and gold recall on the questions' gold items
(:func:`gold_stats`). Tables follow the rules classifier (aggregation tables whole), as
``critic.table_classifier: rules``. Run ``python -m canopy_ray.eval.study --split validation``
and ``--split test`` (two processes; the second to finish writes ``results/study/study.md`` and
``.json``) on the sets ``canopy data convert`` wrote to ``runs/data`` (``scripts/reproduce_eval.sh``
step 1).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from canopy_ray.core.evidence import evidence_body, head, node_text, piece, render_evidence
from canopy_ray.core.files import digest
from canopy_ray.core.hierarchy import ItemTree, Span, build_tree
from canopy_ray.core.items import TableItem
from canopy_ray.core.lexical import bm25, scaled, titled
from canopy_ray.core.metrics import (answer_recall, bootstrap_ci, informative, kept_answer, paired_difference_ci,
                                    refinement_stats)
from canopy_ray.core.policy import Policy
from canopy_ray.core.refine import drive, gate, hybrid, score_lazily
from canopy_ray.core.scoring import best_item, bridge_query, compose, linked
from canopy_ray.core.table_rules import table_kind

SETS = ("hotpotqa", "nq", "tatqa")
# HotpotQA's chained questions: the answer's gold item ranks below the other gold item (bridge_slice)
SLICE = "hotpotqa-bridge"


def trees_of(question, items) -> list[ItemTree]:
    out = []
    for c in question.candidates:
        it = items[c]
        whole = isinstance(it, TableItem) and table_kind(question.question) == "aggregation"
        out.append(build_tree(it, whole=whole))
    return out


def score_set(eval_set, encoder, path: Path) -> list[dict]:
    """Per question: every node's cosine with f_theta (``tuned``) and with f0 (``f0``) and its
    BM25 score (cached as JSON at ``path``), and its f_theta vector (``vectors``, cached beside
    it as ``.npy``: the bridge term scores the nodes against a second query)."""
    vec_path = path.with_suffix(".npy")
    if path.is_file() and vec_path.is_file():
        recs = json.loads(path.read_text())
        flat, cuts = np.load(vec_path), np.cumsum([len(r["nodes"]) for r in recs])[:-1]
        for rec, v in zip(recs, np.split(flat.astype(np.float32), cuts), strict=True):
            rec["vectors"] = v
        return recs
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

    vectors = []
    for q in tqdm(eval_set.questions, desc=path.stem):
        trees = trees_of(q, eval_set.items)
        nodes = [(i, n.span) for i, t in enumerate(trees) for n in t.nodes()]
        pieces = [piece(trees[i], [s]) for i, s in nodes]
        qv = encoder.encode_queries([q.question])[0]
        lex = bm25(q.question, [p.text for p in pieces])
        got = {name: vecs(pieces, name) for name in encoders}
        vectors.append(got["tuned"])
        out.append({"id": q.id, "nodes": [[i, list(s)] for i, s in nodes], "bm25": lex,
                    **{name: (v @ qv).tolist() for name, v in got.items()}})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    np.save(vec_path, np.concatenate(vectors).astype(np.float16))
    for rec, v in zip(out, vectors):
        rec["vectors"] = np.asarray(v, np.float32)
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


STUDY_KEYS = ("below", "fallback", "prf", "len", "hop1", "hop2")
# and the policy each builds on; the oracles keep the question's gold (leaves, or items whole)
STUDY_KINDS = {"gate": "canopy", "gate-leaf": "canopy", "lead": "hybrid", "oracle-sentences": "whole",
               "oracle-items": "whole"}


@dataclass(frozen=True)
class StudyPolicy:
    """A study row's policy: a product :class:`~canopy_ray.core.policy.Policy`, or one with the
    study's own kinds and keys (``extra``) beside it. ``str()`` is the row's name."""

    text: str
    policy: Policy
    kind: str
    extra: tuple[tuple[str, float], ...] = ()

    @classmethod
    def parse(cls, text: str) -> "StudyPolicy":
        kind, *pairs = text.split()
        extra = tuple((k, float(v)) for k, _, v in (p.partition("=") for p in pairs) if k in STUDY_KEYS)
        core = [p for p in pairs if p.partition("=")[0] not in STUDY_KEYS]
        policy = Policy.parse(" ".join([STUDY_KINDS.get(kind, kind), *core]))
        name = text if extra or kind in STUDY_KINDS else str(policy)  # a product policy by its one name
        return cls(name, policy, kind, extra)

    def __str__(self) -> str:
        return self.text

    def get(self, key: str) -> float | None:
        return dict(self.extra).get(key)

    @property
    def product(self) -> bool:
        """Whether a config can run it (``refinement.policy``)."""
        return not self.extra and self.kind not in STUDY_KINDS


def feedback(question: str, trees: list[ItemTree], rec: dict, items: int = 2) -> list[float]:
    """BM25 (scaled) of every node against the question plus the text of the best leaf (by
    ``tuned`` + 0.8 BM25) of each of the ``items`` best items."""
    scores = node_scores(rec, "tuned", StudyPolicy.parse("hybrid bm25=0.8"), len(trees))
    best = [max((n.span for n in t.nodes() if n.is_leaf), key=sc.__getitem__) for t, sc in zip(trees, scores)]
    top = sorted(range(len(trees)), key=lambda i: -scores[i][best[i]])[:items]
    return scaled(bm25(" ".join([question] + [node_text(trees[i], best[i]) for i in top]),
                       [node_text(trees[i], tuple(span)) for i, span in rec["nodes"]]))


def item_texts(trees: list[ItemTree], rec: dict) -> dict:
    """What the link term reads: the items' titles and bodies, and which nodes are leaves (a
    single-node item's root is its leaf)."""
    leaves = [{n.span for n in t.nodes() if n.is_leaf} for t in trees]
    return {"titles": [t.item.title for t in trees], "bodies": [piece(t, [t.root.span]).body for t in trees],
            "leaf": [tuple(span) in leaves[i] for i, span in rec["nodes"]],
            "single": [not trees[i].root.children for i, _ in rec["nodes"]]}


def prepared(name: str, split: str, data: Path, work: Path, encoder) -> tuple:
    """A data set's split, every node scored (cached at ``work`` under the encoder's identity:
    another adapter scores afresh), its trees (built once: every policy replays them) and the
    terms :func:`node_scores` adds."""
    from canopy_ray.eval.runs import load_eval_set

    d = data / name
    es = load_eval_set(name, d / "questions.jsonl", d / "corpus.jsonl", split=split)
    recs = score_set(es, encoder, work / f"{name}-{split}-{digest([encoder.model_id, encoder.adapter_id], 12)}.json")
    trees = [trees_of(q, es.items) for q in es.questions]
    queries: dict[str, np.ndarray] = {}  # bridge query -> f0 of it

    def bridged(q, ts, rec):
        def cosines(item: int) -> np.ndarray:
            text = bridge_query(q.question, piece(ts[item], [ts[item].root.span]).text)
            if text not in queries:
                queries[text] = np.asarray(encoder.encode_queries([text])[0], np.float32)
            return rec["vectors"] @ queries[text]
        return cosines

    for q, ts, rec in zip(es.questions, trees, recs):
        rec.update(item_texts(ts, rec))
        rec["titled"] = titled(rec["titles"], q.question)
        rec["prf"], rec["len"] = feedback(q.question, ts, rec), log_words(ts, rec)
        rec["bridge"] = bridged(q, ts, rec)
    return es, trees, recs


def log_words(trees: list[ItemTree], rec: dict) -> list[float]:
    """log(words) of every node's text: ``len=B`` lets a (longer) parent win more of its
    comparisons with its children when B > 0, and fewer when B < 0."""
    return [math.log(max(1, len(node_text(trees[i], tuple(span)).split()))) for i, span in rec["nodes"]]


def node_scores(rec: dict, base: str, sp: StudyPolicy, n_items: int) -> list[dict[Span, float]]:
    """Every node's score as the compressor composes it (:func:`canopy_ray.core.scoring.compose`),
    the study's ``prf`` and ``len`` terms added to the cosine before it, a ``hop`` term in the
    link term's place."""
    s = np.asarray(rec[base], np.float32)
    for key in ("prf", "len"):
        if sp.get(key):
            s = s + np.float32(sp.get(key)) * np.asarray(rec[key], np.float32)
    terms, asked, items = sp.policy.terms, [i for i, hit in enumerate(rec["titled"]) if hit], 2
    for hop in ("hop1", "hop2"):
        if sp.get(hop):
            terms, asked, items = replace(terms, link=sp.get(hop)), [], int(hop[3])
    item_of = [i for i, _ in rec["nodes"]]

    def link(partial):
        return linked(rec["titles"], rec["bodies"].__getitem__,
                      ((i, v) for i, v, leaf in zip(item_of, partial.tolist(), rec["leaf"]) if leaf), asked, items)

    def bridge(partial):  # the best of the nodes the policy asks for first, as the compressor picks it
        if base != "tuned":
            raise ValueError(f"the bridge term reads f_theta's vectors: not with the {base} scorer")
        first = np.array([leaf and (sp.policy.kind == "flat" or not single or bool(terms.link))
                          for leaf, single in zip(rec["leaf"], rec["single"])])
        if not first.any():  # nothing ranked: no bridge
            return -1, np.full(len(partial), -np.inf)
        b = best_item(np.asarray(item_of)[first], partial[first])
        return b, rec["bridge"](b)

    s = compose(s, item_of, terms, bm25=scaled(rec["bm25"]) if terms.bm25 else None, cross=rec.get("cross"),
                titled=rec["titled"], link=link, bridge=bridge)
    out: list[dict[Span, float]] = [{} for _ in range(n_items)]
    for (i, span), v in zip(rec["nodes"], s.tolist()):
        out[i][tuple(span)] = v
    return out


def visited_best(tree: ItemTree, sc: dict[Span, float], margin: float) -> float:
    """The best score among the nodes Algorithm 1 visits (all a lazy scorer knows)."""
    seen = drive(score_lazily([tree.root], margin), lambda ask: [sc[n.span] for _, n in ask])[0]
    return max(seen.values()) if seen else sc[tree.root.span]


def apply(sp: StudyPolicy, trees: list[ItemTree], scores: list[dict[Span, float]]) -> list[list[Span]]:
    """Kept spans per item (empty: the item is left out)."""
    roots, p = [t.root for t in trees], sp.policy
    if sp.kind in ("gate", "gate-leaf"):
        kept = p.keep(roots, scores)
        stay = gate([visited_best(t, sc, p.margin) for t, sc in zip(trees, scores)], sp.get("below") or 0.0)
        leaf = [[max((n.span for n in t.nodes() if n.is_leaf), key=lambda s: sc[s])] for t, sc in zip(trees, scores)]
        return [k if ok else (b if sp.kind == "gate-leaf" else []) for k, ok, b in zip(kept, stay, leaf)]
    if sp.kind == "lead" or sp.get("fallback"):
        return hybrid(roots, scores, p.share, sp.get("fallback") or 0.0, lead=sp.kind == "lead", cutoff=p.cutoff, z=p.z)
    return p.keep(roots, scores)


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


def bridge_slice(questions, trees_per_question, recs: list[dict]) -> list[bool]:
    """Per question, whether it is a chained one: two gold items or more, the answer in the text
    of one of them only, and that item's root scoring below another gold item's by f0 (the
    frozen encoder: no adapter decides the slice). A rule on the questions and the frozen
    scorer alone, the same on every split."""
    out = []
    for q, trees, rec in zip(questions, trees_per_question, recs):
        gold = {g.item_id for g in q.gold}
        golden = [i for i, c in enumerate(q.candidates) if c in gold]
        root = {i: v for (i, span), v in zip(rec["nodes"], rec["f0"]) if tuple(span) == trees[i].root.span}
        texts = {i: piece(trees[i], [trees[i].root.span]).text for i in golden}
        holding = [i for i in golden if kept_answer(q.answers, texts[i], texts.values())]
        out.append(len(golden) >= 2 and len(holding) == 1
                   and root[holding[0]] < max(root[i] for i in golden if i != holding[0]))
    return out


WHOLE = StudyPolicy.parse("whole")


def oracle(sp: StudyPolicy, question, trees: list[ItemTree]) -> list[list[Span]]:
    """What the oracles keep: the gold leaves (``oracle-sentences``) or the gold items whole
    (``oracle-items``); a gold item without located leaves whole in both."""
    gold = {g.item_id: g.leaves for g in question.gold}
    out = []
    for c, t in zip(question.candidates, trees):
        leaves = [i for i in gold.get(c, ()) if i < t.n_leaves]
        if c not in gold:
            out.append([])
        elif sp.kind == "oracle-sentences" and leaves and t.root.children:
            out.append(sorted((t.root.span[0] + i, t.root.span[0] + i + 1) for i in leaves))
        else:
            out.append([t.root.span])
    return out


def evaluate(sp: StudyPolicy, base: str, questions, trees_per_question, recs: list[dict], count) -> list[dict]:
    rows = []
    for q, trees, rec in zip(questions, trees_per_question, recs):
        scores = node_scores(rec, base, sp, len(trees))
        kept = oracle(sp, q, trees) if sp.kind.startswith("oracle") else apply(sp, trees, scores)
        pieces = [piece(t, k) for t, k in zip(trees, kept) if k]
        useful = bool(q.answers) and informative(q.answers, [head(t.item) for t in trees])
        whole = [piece(t, [t.root.span]).text for t in trees]
        rows.append({"tokens": count(render_evidence(pieces)),
                     "recall": kept_answer(q.answers, render_evidence(pieces), whole),
                     "recall_inf": answer_recall(evidence_body(pieces), q.answers) if useful else None,
                     "gold": gold_stats(q, trees, scores, kept)})
    return rows


def _paired(rows: list[dict], whole: list[dict], key: str) -> dict:
    pairs = [(r[key], w[key]) for r, w in zip(rows, whole) if r[key] is not None]
    r, d = bootstrap_ci([a for a, _ in pairs]), paired_difference_ci([a for a, _ in pairs], [b for _, b in pairs])
    return {"recall": r.mean, "recall_ci": [r.low, r.high], "delta": d.mean, "delta_ci": [d.low, d.high],
            "n": len(pairs)}


def summary(rows: list[dict], whole: list[dict]) -> dict:
    tok = np.array([r["tokens"] for r in rows], float)
    base = np.array([r["tokens"] for r in whole], float)
    head_, inf = _paired(rows, whole, "recall"), _paired(rows, whole, "recall_inf")
    gold = [g for row in rows for g in row["gold"]]
    return {"tokens": float(tok.mean()), "saved": float(1 - tok.sum() / base.sum()), **head_,
            "n_ans": head_.pop("n"), "n": len(rows),
            # the titles-aside figure: body answer recall on the informative questions
            "recall_inf": inf["recall"], "delta_inf": inf["delta"], "delta_inf_ci": inf["delta_ci"], "n_inf": inf["n"],
            # micro counts, pooled over the sets by the decisions table
            "preferences": [sum(g.pref_correct for g in gold), sum(g.pref_nodes for g in gold)],
            "gold_leaves": [sum(g.gold_kept for g in gold), sum(g.gold_leaves for g in gold)]}


# The score terms tried with every ranking selection, per base scorer ("": the cosine alone)
TERMS = {"f0": ("", "bm25=0.4"),
         "tuned": ("", "bm25=0.2", "bm25=0.4", "bm25=0.8", "bm25=1.2", "bm25=1.6",
                   "bm25=0.8 prf=0.2", "bm25=0.8 prf=0.4", "bm25=0.8 prf=0.8",
                   "bm25=0.4 len=-0.04", "bm25=0.4 len=-0.02", "bm25=0.4 len=0.02", "bm25=0.4 len=0.04",
                   "bm25=0.4 hop1=0.2", "bm25=0.4 hop2=0.1", "bm25=0.4 hop2=0.2", "bm25=0.4 hop2=0.4",
                   "bm25=0.4 title=0.1", "bm25=0.4 title=0.1 hop2=0.2", "bm25=0.4 title=0.2 hop2=0.2",
                   "bm25=0.4 title=0.4 hop2=0.2",
                   "bm25=0.4 link=0.2", "bm25=0.4 title=0.1 link=0.2", "bm25=0.4 title=0.2 link=0.2",
                   "bm25=0.4 bridge=0.5", "bm25=0.4 bridge=1", "bm25=0.4 title=0.1 link=0.2 bridge=0.5",
                   "bm25=0.4 title=0.1 link=0.2 bridge=1")}
CROSS_TERMS = {"cross": ("", "bm25=0.2", "bm25=0.4", "bm25=0.8"),
               "tuned": ("bm25=0.8 cross=0.2", "bm25=0.8 cross=0.4", "bm25=0.4 cross=0.2 link=0.2",
                         "bm25=0.4 cross=0.4 link=0.2", "bm25=0.4 cross=0.2 title=0.1 link=0.2")}
# Selections: those that rank leaves take every TERMS entry; Algorithm 1's scores by cosine alone
RANKED = ([f"{p} share={r}" for p in ("hybrid", "lead", "flat") for r in (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6)]
          + [f"{p} share={r} fallback=0.02" for p in ("hybrid", "lead") for r in (0.4, 0.5)]
          + [f"hybrid share=1 cutoff={d}" for d in (0.4, 0.5, 0.6)] + [f"hybrid share=0.4 cutoff={d}" for d in (0.8, 0.9, 1)])
# The room left: only the gold sentences, or the gold items whole (scorer aside)
ORACLES = ("oracle-sentences", "oracle-items")
PLAIN = (["canopy margin=0", "canopy margin=0.05"]
         + [f"{g} margin=0.05 below={d}" for g in ("gate", "gate-leaf") for d in (0.1, 0.2)])
# Adaptive selections (a per-question budget from the scores: a gap below the best leaf, or a
# bar in standard deviations above the leaves' mean), tried with fewer terms
ADAPTIVE = ([f"hybrid share=1 cutoff={d}" for d in (0.3, 0.35, 0.45)]
            + [f"hybrid share=1 z={z}" for z in (0, 0.25, 0.5, 0.75, 1, 1.25, 1.5)]
            + [f"hybrid share=0.4 z={z}" for z in (0, 0.5)] + [f"hybrid share=0.3 z={z}" for z in (0, 0.5)])
ADAPTIVE_TERMS = ("", "bm25=0.4", "bm25=0.4 title=0.1 link=0.2", "bm25=0.4 bridge=0.5", "bm25=0.4 bridge=1",
                  "bm25=0.4 title=0.1 link=0.2 bridge=0.5", "bm25=0.4 title=0.1 link=0.2 bridge=1")
# Within these of passing items whole (headline answer recall, points): the bar
TOLERANCE = {"hotpotqa": 0.02, "nq": 0.02, "tatqa": 0.01, SLICE: 0.03}


def rows_of(terms: dict[str, tuple[str, ...]]) -> list[tuple[str, StudyPolicy]]:
    """Every (base, policy) of ``terms`` with every selection it combines with."""
    out = [("tuned", StudyPolicy.parse(o)) for o in ORACLES if "tuned" in terms and "" in terms["tuned"]]
    for base, extra in terms.items():
        out += [(base, StudyPolicy.parse(sel)) for sel in PLAIN if "" in extra]
        out += [(base, StudyPolicy.parse(f"{sel} {t}".strip())) for t in extra for sel in RANKED]
        if base == "tuned" and "" in extra:
            out += [(base, StudyPolicy.parse(f"{sel} {t}".strip())) for t in ADAPTIVE_TERMS for sel in ADAPTIVE]
    return out


def choose(val: dict) -> tuple[str, str]:
    """The (scorer, policy) saving the most tokens on average over the sets while the
    validation recall of every set (and slice) in ``val`` is within :data:`TOLERANCE` of whole
    items; none within: the best average recall."""
    within = [s for s in TOLERANCE if s in val]
    ok = [(np.mean([val[s][key]["saved"] for s in SETS]), key) for key in val[SETS[0]]
          if all(val[s][key]["delta"] >= -TOLERANCE[s] for s in within)]
    return max(ok)[1] if ok else max((np.mean([val[s][k]["delta"] for s in within]), k) for k in val[SETS[0]])[1]


def write_config(path: Path, chosen: tuple[str, str]) -> None:
    """The pick written into a config's ``refinement.policy`` (its line replaced, the rest kept)."""
    base, text = chosen
    sp = StudyPolicy.parse(text)
    if base != "tuned" or not sp.product:
        raise ValueError(f"the pick {base} / {text} is no policy a config runs (f_theta and a product policy): "
                         f"{path} left as it is")
    src = path.read_text()
    new, n = re.subn(r"(?m)^(  policy: ).*$", lambda m: m.group(1) + str(sp), src)
    if n != 1:
        raise ValueError(f"{path} has no one 'policy:' line under refinement")
    path.write_text(new)


def table(results: dict, chosen: tuple[str, str], split: str, ship: tuple[str, str] | None = None) -> list[str]:
    sets = list(results)
    lines = [f"### {split}", "",
             "| scorer | policy | " + " | ".join(f"{s} saved | {s} answer kept [95%] | {s} Δ vs whole [95%] | "
                                                 f"{s} Δ titles aside" for s in sets)
             + " |", "|---|---|" + "---|" * (4 * len(sets))]
    for key in results[SETS[0]]:
        cells = []
        for s in sets:
            r = results[s][key]
            cells += [f"{100 * r['saved']:.1f}%", f"{r['recall']:.3f} [{r['recall_ci'][0]:.3f}, {r['recall_ci'][1]:.3f}]",
                      f"{100 * r['delta']:+.1f} [{100 * r['delta_ci'][0]:+.1f}, {100 * r['delta_ci'][1]:+.1f}]",
                      f"{100 * r['delta_inf']:+.1f}"]
        mark = (" **(chosen)**" if key == chosen else "") + (" **(shipped)**" if key == ship else "")
        lines.append(f"| {key[0]} | {key[1]}{mark} | " + " | ".join(cells) + " |")
    return lines


SELECTION_KEYS = ("margin", "share", "top", "cutoff", "z", "below", "fallback")


def scorer_of(key: tuple[str, str]) -> tuple[str, str]:
    """A row's scorer: its base and the policy's score terms (the selection aside)."""
    base, text = key
    return base, " ".join(p for p in text.split()[1:] if p.partition("=")[0] not in SELECTION_KEYS)


def decisions(results: dict, split: str, ship: tuple[str, str]) -> list[str]:
    """Each scorer's decision accuracy on the gold items (its preferences, whatever the selection)
    and the gold recall of Algorithm 1 and of the shipped selection with it, micro, pooled over the sets."""
    def pct(key, field, sets=SETS):
        counts = [results[s].get(key, {}).get(field) for s in sets]
        if None in counts:
            return "-"
        hit, n = (sum(c[i] for c in counts) for i in (0, 1))
        return f"{100 * hit / n:.1f}" if n else "-"

    kind, *pairs = ship[1].split()
    selection = " ".join([kind] + [p for p in pairs if p.partition("=")[0] in SELECTION_KEYS])
    lines = [f"### {split}: decisions on gold items", "",
             "| scorer | " + " | ".join(f"decision accuracy, {s}" for s in SETS) + " | decision accuracy, all | "
             f"gold recall, canopy margin=0 | gold recall, {selection} |", "|---|" + "---|" * (len(SETS) + 3)]
    by_scorer: dict = {}
    for key in results[SETS[0]]:
        by_scorer.setdefault(scorer_of(key), key)  # any row of the scorer has its preferences
    for scorer, any_row in by_scorer.items():
        a1 = (scorer[0], "canopy margin=0") if not scorer[1] else None
        sh = (scorer[0], str(StudyPolicy.parse(f"{selection} {scorer[1]}".strip())))
        cells = [pct(any_row, "preferences", [s]) for s in SETS] + [pct(any_row, "preferences"),
                                                                   pct(a1, "gold_leaves") if a1 else "-",
                                                                   pct(sh, "gold_leaves")]
        mark = " **(shipped)**" if scorer == scorer_of(ship) else ""
        lines.append(f"| {scorer[0]} {scorer[1] or '(cosine)'}{mark} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="runs/data", help="converted sets (canopy data convert)")
    ap.add_argument("--work", default="runs/study", help="cached node scores")
    ap.add_argument("--out", default="results/study")
    ap.add_argument("--config", default=None)
    ap.add_argument("--adapter", default=None, help="f_theta's adapter (default: the config's); give it its own --work")
    ap.add_argument("--cross", default=None, help="a cross-encoder scorer (canopy_ray.train.cross): adds the "
                    "rows that use it (CROSS_TERMS)")
    ap.add_argument("--split", choices=["validation", "test"], default=None,
                    help="score and replay one split only (two processes in parallel); the tables are "
                         "written once both splits' results are in --work")
    ap.add_argument("--tables", action="store_true", help="only write the tables from the results in --work")
    ap.add_argument("--write-config", default=None, metavar="FILE",
                    help="write the pick into FILE's refinement.policy (configs/cpu.yaml)")
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
    keys = rows_of(TERMS) + (rows_of(CROSS_TERMS) if cross else [])
    work = Path(args.work)
    for split in [] if args.tables else [args.split] if args.split else ["validation", "test"]:
        res = {}
        for s in SETS:
            es, trees, recs = prepared(s, split, Path(args.data), work, encoder)
            if cross is not None:  # cached under its identity too
                cross_scores(es.questions, trees, recs, cross, work / f"{s}-{split}-{cross.adapter_id.replace(':', '-')}.json")
            whole = evaluate(WHOLE, "tuned", es.questions, trees, recs, count)
            rows = {(base, str(sp)): evaluate(sp, base, es.questions, trees, recs, count) for base, sp in keys}
            res[s] = [{"scorer": b, "policy": p, **summary(r, whole)} for (b, p), r in rows.items()]
            print(f"{split} {s}: {len(es.questions)} questions", flush=True)
            if s == "hotpotqa":
                sel = bridge_slice(es.questions, trees, recs)
                part = [w for w, k in zip(whole, sel) if k]
                res[SLICE] = [{"scorer": b, "policy": p, **summary([x for x, k in zip(r, sel) if k], part)}
                              for (b, p), r in rows.items()]
                print(f"{split} {SLICE}: {sum(sel)} questions", flush=True)
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
    # the pick is what a config can ship (f_theta, a product policy); the study's own rows stay for the record
    shippable = {s: {k: r for k, r in rows.items() if k[0] == "tuned" and StudyPolicy.parse(k[1]).product}
                 for s, rows in results["validation"].items()}
    chosen, ship = choose(shippable), ("tuned", str(cfg.policy))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["# Compression policies on the given setting (k = 10, B = 2, reader tokens of SmolLM2)", "",
             "Made by `python -m canopy_ray.eval.study` (module docstring: the policies). Chosen on validation, "
             "among the rows a config can ship (f_theta and a product policy; the study's own rows are kept for "
             "the record): the most tokens saved on average over the three sets with every set's headline answer recall "
             f"within {', '.join(f'{s} {100 * t:.0f}' for s, t in TOLERANCE.items())} points of whole items; "
             f"chosen: **{chosen[0]} / {chosen[1]}**; shipped by the config: **{ship[0]} / {ship[1]}** "
             f"(`tuned`: f_theta, adapter `{encoder.adapter_id}`). Saved: reader tokens against whole items. "
             "Answer kept: a gold answer in the kept evidence, the kept items' titles and header rows included, "
             "over the questions whose whole items hold one. Δ: paired difference against whole items, points; "
             "titles aside: the same for body answer recall on the informative questions. "
             "What was tried and why: HISTORY.md beside this file.", ""]
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
    print("\n".join(lines[:4]))
    if args.write_config:
        try:
            write_config(Path(args.write_config), chosen)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote refinement.policy: {chosen[1]} into {args.write_config}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
