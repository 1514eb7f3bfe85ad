"""Refinement evaluation without an LLM: f0 against f_theta on gold items.

For every gold item (located leaves, >= 2 leaves) of the chosen questions, each node is
scored s(q, v) = cos(f0(q), f(v)) with f = f0 (frozen) or f_theta (adapter), refined with
Algorithm 1 (:func:`canopy_ray.core.refine.refine`) and measured:

- decision accuracy: share of preference nodes (CANOPY 3) where every preference holds;
- gold recall: share of gold leaves inside the kept spans;
- pruned share: share of items from which refinement removes something;
- kept words / kept tokens: micro-averaged share of the items' leaf words
  (whitespace-split) / tokens (:func:`canopy_ray.core.evidence.count_words`) kept.

By depth: decision accuracy of the preference nodes at depth d; recall, pruned share and
kept shares when refinement may descend at most d levels (a node at depth d is kept
whole); and the mean root-relative score s(v) - s(root) of gold-overlapping and non-gold
nodes at depth d (the paper's root-relative score figure). Tables are treated as lookup
(no aggregation classifier here: that needs an LLM).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from canopy_ray.core.evidence import count_words, node_text
from canopy_ray.core.hierarchy import ItemTree, Node, Span
from canopy_ray.core.items import TableItem, TextItem
from canopy_ray.core.metrics import (RefinementStats, decision_accuracy, gold_recall, pruned_share,
                                     refinement_stats)
from canopy_ray.core.pairs import preference_nodes
from canopy_ray.core.refine import refine
from canopy_ray.core.files import cached_array, write_json, write_text
from canopy_ray.core.splits import GoldItem, family, gold_items
from canopy_ray.data.sets import load_dataset

METRICS = ("decision_accuracy", "gold_recall", "pruned_share", "kept_words", "kept_tokens")
LABELS = {"decision_accuracy": "decision accuracy", "gold_recall": "gold recall",
          "pruned_share": "pruned share", "kept_words": "kept words", "kept_tokens": "kept tokens"}


def leaf_texts(tree: ItemTree) -> list[str]:
    item = tree.item
    if isinstance(item, TextItem):
        return [s.strip() for s in item.sentences]
    if isinstance(item, TableItem):
        return [" | ".join(row) for row in item.rows]
    return [node_text(tree, (i, i + 1)) for i in range(tree.n_leaves)]


def truncate(node: Node, depth: int) -> Node:
    """The tree cut below ``depth`` (nodes at that depth become leaves)."""
    if depth == 0 or node.is_leaf:
        return Node(node.span)
    return Node(node.span, tuple(truncate(c, depth - 1) for c in node.children))


def tree_depth(node: Node) -> int:
    return max((d for _, d in node.walk()), default=0)


@dataclass
class Tally:
    """Running counts for one (data set family, encoder)."""

    stats: list[RefinementStats] = field(default_factory=list)
    words: list[int] = field(default_factory=lambda: [0, 0])  # kept, total
    tokens: list[int] = field(default_factory=lambda: [0, 0])
    depth_pref: dict = field(default_factory=lambda: defaultdict(lambda: [0, 0]))  # d -> correct, n
    depth_limit: dict = field(default_factory=lambda: defaultdict(lambda: {
        "gold": [0, 0], "pruned": [0, 0], "words": [0, 0], "tokens": [0, 0]}))
    depth_rel: dict = field(default_factory=lambda: defaultdict(lambda: {"gold": [], "other": []}))

    def add(self, gi: GoldItem, scores: Mapping[Span, float], words: Sequence[int],
            tokens: Sequence[int], max_depth: int) -> None:
        root = gi.tree.root
        kept = refine(root, scores)
        self.stats.append(refinement_stats(root, scores, kept, gi.gold))
        keep = {i for a, b in kept for i in range(a, b)}
        self.words[0] += sum(words[i] for i in keep)
        self.words[1] += sum(words)
        self.tokens[0] += sum(tokens[i] for i in keep)
        self.tokens[1] += sum(tokens)
        depth_of = {n.span: d for n, d in root.walk()}
        for pn in preference_nodes(root, gi.gold):
            cell = self.depth_pref[depth_of[pn.node.span]]
            cell[0] += pn.correct(scores)
            cell[1] += 1
        for n, d in root.walk():
            gold = any(i in gi.gold for i in range(*n.span))
            self.depth_rel[d]["gold" if gold else "other"].append(scores[n.span] - scores[root.span])
        for d in range(max_depth + 1):
            kept_d = refine(truncate(root, d), scores)
            keep_d = {i for a, b in kept_d for i in range(a, b)}
            cell = self.depth_limit[d]
            cell["gold"][0] += len(gi.gold & keep_d)
            cell["gold"][1] += len(gi.gold)
            cell["pruned"][0] += len(keep_d) < root.size
            cell["pruned"][1] += 1
            cell["words"][0] += sum(words[i] for i in keep_d)
            cell["words"][1] += sum(words)
            cell["tokens"][0] += sum(tokens[i] for i in keep_d)
            cell["tokens"][1] += sum(tokens)

    def summary(self) -> dict:
        return {"items": len(self.stats), "pref_nodes": sum(s.pref_nodes for s in self.stats),
                "decision_accuracy": decision_accuracy(self.stats),
                "gold_recall": gold_recall(self.stats), "pruned_share": pruned_share(self.stats),
                "kept_words": _ratio(self.words), "kept_tokens": _ratio(self.tokens)}

    def by_depth(self) -> dict:
        depths = sorted(set(self.depth_pref) | set(self.depth_limit))
        out = {}
        for d in depths:
            lim = self.depth_limit.get(d)
            rel = self.depth_rel.get(d, {"gold": [], "other": []})
            out[d] = {"decision_accuracy": _ratio(self.depth_pref[d]) if d in self.depth_pref else None,
                      "pref_nodes": self.depth_pref[d][1] if d in self.depth_pref else 0,
                      "gold_recall": _ratio(lim["gold"]) if lim else None,
                      "pruned_share": _ratio(lim["pruned"]) if lim else None,
                      "kept_words": _ratio(lim["words"]) if lim else None,
                      "kept_tokens": _ratio(lim["tokens"]) if lim else None,
                      "rel_gold": float(np.mean(rel["gold"])) if rel["gold"] else None,
                      "rel_other": float(np.mean(rel["other"])) if rel["other"] else None}
        return out


def _ratio(pair: Sequence[int]) -> float:
    return pair[0] / pair[1] if pair[1] else float("nan")


def encode_texts(encoder, texts: Sequence[str], chunk: int = 1024) -> np.ndarray:
    """``encoder.encode_nodes`` over texts, in chunks with a progress bar (on a terminal only)
    when there are more than ``chunk``: thousands of gold items take minutes on a CPU."""
    from tqdm import tqdm

    from canopy_ray.core.evidence import Piece

    pieces = [Piece("", "text", (), t) for t in texts]
    if len(pieces) <= chunk:
        return encoder.encode_nodes(pieces)
    parts = []
    with tqdm(total=len(pieces), desc="encoding nodes", unit="node", disable=None) as bar:
        for i in range(0, len(pieces), chunk):
            parts.append(encoder.encode_nodes(pieces[i:i + chunk]))
            bar.update(len(parts[-1]))
    return np.concatenate(parts)


def query_vectors(gold: Sequence[GoldItem], f0, cache_dir: str | Path | None = None) -> dict[str, np.ndarray]:
    """f0 of each gold item's question (cached per model in ``cache_dir`` when given)."""
    queries = sorted({gi.question.question for gi in gold})
    return dict(zip(queries, cached_array(cache_dir, "queries", [f"queries:{getattr(f0, 'model_id', '')}", queries],
                                          lambda: f0.encode_queries(queries))))


def score_items(gold: Sequence[GoldItem], q_vecs: Mapping[str, np.ndarray], encoder,
                cache_dir: str | Path | None = None) -> list[dict]:
    """Node scores per gold item: cos(f0(q), encoder nodes); node texts encoded once each
    (and cached per encoder in ``cache_dir`` when given). A cross-encoder (``score(query,
    texts)``) scores each item's nodes with its question instead."""
    if hasattr(encoder, "score"):
        from tqdm import tqdm

        return [dict(zip(spans := [n.span for n in gi.tree.nodes()],
                         encoder.score(gi.question.question, [node_text(gi.tree, s) for s in spans]).tolist()))
                for gi in tqdm(gold, desc="cross-encoder", unit="item", disable=None)]
    texts: dict[str, int] = {}
    per_item = []
    for gi in gold:
        spans = [n.span for n in gi.tree.nodes()]
        per_item.append([(s, texts.setdefault(node_text(gi.tree, s), len(texts))) for s in spans])
    tag = f"nodes:{getattr(encoder, 'model_id', '')}:{getattr(encoder, 'adapter_id', '')}"
    vecs = cached_array(cache_dir, "nodes", [tag, list(texts)],
                        lambda: encode_texts(encoder, list(texts)))
    out = []
    for gi, rows in zip(gold, per_item):
        q = q_vecs[gi.question.question]
        out.append({s: float(vecs[r] @ q) for s, r in rows})
    return out


def evaluate(gold: Sequence[GoldItem], encoders: Mapping[str, object], f0=None,
             max_depth: int | None = None, cache_dir: str | Path | None = None) -> dict:
    """``{family: {encoder_label: {"summary": ..., "by_depth": ...}}}`` plus ``"all"``.

    ``encoders`` maps a label (``f0``, ``f_theta``) to an encoder with ``encode_nodes``;
    queries are always encoded by ``f0`` (default: the first encoder's ``encode_queries``,
    which never uses an adapter).
    """
    q_vecs = query_vectors(gold, f0 or next(iter(encoders.values())), cache_dir)
    if max_depth is None:
        max_depth = max((tree_depth(gi.tree.root) for gi in gold), default=0)
    lengths = []
    for gi in gold:
        leaves = leaf_texts(gi.tree)
        lengths.append(([len(t.split()) for t in leaves], [count_words(t) for t in leaves]))
    report: dict = {}
    for label, enc in encoders.items():
        scores = score_items(gold, q_vecs, enc, cache_dir)
        tallies: dict[str, Tally] = defaultdict(Tally)
        for gi, sc, (w, tk) in zip(gold, scores, lengths):
            for key in (family(gi.dataset), "all"):
                tallies[key].add(gi, sc, w, tk, max_depth)
        for key, tally in tallies.items():
            report.setdefault(key, {})[label] = {"summary": tally.summary(),
                                                 "by_depth": tally.by_depth()}
    return report


def to_markdown(report: Mapping) -> str:
    """One row per (data set, encoder): items, nodes and the five metrics in percent."""
    head = ("| data set | encoder | items | pref. nodes | decision acc. | gold recall | "
            "pruned share | kept words | kept tokens |")
    lines = [head, "|" + "---|" * 9]
    for fam in sorted(report, key=lambda k: (k == "all", k)):
        for label, r in report[fam].items():
            s = r["summary"]
            cells = [fam, label, str(s["items"]), str(s["pref_nodes"])] + [
                f"{100 * s[m]:.1f}" for m in METRICS]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_by_depth(report: Mapping, path: str | Path) -> Path:
    """A grid: one row per data set, one column per metric (plus root-relative score),
    f0 and f_theta as lines over tree depth."""
    from canopy_ray.plots import pyplot, save

    plt = pyplot()

    fams = sorted(report, key=lambda k: (k == "all", k))
    cols = list(METRICS) + ["root_relative"]
    fig, axes = plt.subplots(len(fams), len(cols), figsize=(3.2 * len(cols), 2.6 * len(fams)),
                             squeeze=False)
    for i, fam in enumerate(fams):
        for j, metric in enumerate(cols):
            ax = axes[i][j]
            for label, r in report[fam].items():
                bd = r["by_depth"]
                ds = sorted(int(d) for d in bd)
                if metric == "root_relative":
                    for kind, style in (("rel_gold", "-"), ("rel_other", ":")):
                        pts = [(d, bd[d][kind]) for d in ds if bd[d][kind] is not None]
                        if pts:
                            ax.plot(*zip(*pts), style, marker="o", ms=3,
                                    label=f"{label} {'gold' if kind == 'rel_gold' else 'non-gold'}")
                    continue
                pts = [(d, 100 * bd[d][metric]) for d in ds if bd[d][metric] is not None]
                if pts:
                    ax.plot(*zip(*pts), marker="o", ms=3, label=label)
            title = "s(v) - s(root)" if metric == "root_relative" else LABELS[metric] + " %"
            ax.set_title(f"{fam}: {title}", fontsize=8)
            ax.set_xlabel("tree depth" if metric == "decision_accuracy" or metric == "root_relative"
                          else "max refinement depth", fontsize=7)
            ax.tick_params(labelsize=7)
            if i == 0 and j in (0, len(cols) - 1):
                ax.legend(fontsize=6)
    return save(fig, path, 110)


def collect(data_dirs: Mapping[str, str | Path], split: str | None, branching: int = 2) -> list[GoldItem]:
    """Gold items (located, >= 2 leaves) of the questions in ``split`` (None = all)."""

    out: list[GoldItem] = []
    for name in sorted(data_dirs):
        items, questions = load_dataset(data_dirs[name])
        out.extend(gold_items(name, items, questions, split, branching))
    return out


def run(cfg, data_dirs: Mapping[str, str | Path], split: str | None, out_dir: str | Path,
        adapter: str | Path | None = None, cache_dir: str | Path | None = None,
        cross: str | Path | None = None) -> dict:
    """Evaluate f0 (and f_theta when ``adapter`` is given) and write ``refinement.json``,
    ``refinement.md`` and ``refinement_by_depth.png`` into ``out_dir``. Query and node
    vectors are cached in ``cache_dir`` (keyed by encoder and texts) when given."""
    from canopy_ray.config import portable_path
    from canopy_ray.models.encoder import build_encoder, frozen_nodes

    gold = collect(data_dirs, split, cfg.hierarchy.branching)
    f_theta = build_encoder(cfg.models.model_copy(update={"adapter": adapter}))
    encoders = {"f0": frozen_nodes(f_theta)} | ({"f_theta": f_theta} if adapter else {})
    if cross:
        from canopy_ray.models.cross import CrossScorer

        encoders["cross"] = CrossScorer(cross, max_length=cfg.models.max_length)
    report = evaluate(gold, encoders, cache_dir=cache_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"split": split or "all", "sets": sorted(data_dirs), "adapter": portable_path(str(adapter)) if adapter else None,
            "cross": portable_path(str(cross)) if cross else None}
    write_json(out / "refinement.json", {"meta": meta, "report": report}, default=float)
    write_text(out / "refinement.md",
        f"Refinement on gold items, split `{meta['split']}`, adapter `{meta['adapter']}`\n\n"
        + to_markdown(report))
    plot_by_depth(report, out / "refinement_by_depth.png")
    return report


def build_parser():
    import argparse

    from canopy_ray.data.sets import SHARED_SETS, default_shared_root

    p = argparse.ArgumentParser(prog="canopy eval-refinement",
                                description="Refinement evaluation of f0 vs f_theta on gold items of held-out "
                                            "questions (no LLM).")
    p.add_argument("--config", default="configs/cpu.yaml")
    p.add_argument("--split", default="test", choices=["train", "validation", "test", "all"])
    p.add_argument("--sets", nargs="+", default=list(SHARED_SETS), choices=list(SHARED_SETS))
    p.add_argument("--shared-data", default=default_shared_root(),
                   help="the raw shared data root (default: $CANOPY_SHARED_DATA or ../shared/data)")
    p.add_argument("--work-dir", default="runs/data", help="converted data sets go here")
    p.add_argument("--adapter", default=None, help="f_theta adapter dir (default: config's)")
    p.add_argument("--frozen", action="store_true", help="evaluate f0 only")
    p.add_argument("--cross", default=None, help="also a cross-encoder scorer (canopy_ray.train.cross)")
    p.add_argument("--out", default="runs/eval-refinement")
    p.add_argument("--cache", default=None, help="cache query/node vectors here (per encoder)")
    return p


def main(argv=None) -> int:
    """``canopy eval-refinement`` / ``jobs/eval_refinement.py``."""
    import sys

    from canopy_ray.config import ConfigError, load_config, resolve_path
    from canopy_ray.data.records import ConvertError
    from canopy_ray.data.sets import prepare_shared

    args = build_parser().parse_args(argv)
    try:
        cfg = load_config(args.config)
        dirs = prepare_shared(args.shared_data, args.work_dir, args.sets)
    except (ConfigError, ConvertError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    adapter = None if args.frozen else (args.adapter or resolve_path(cfg.models.adapter))
    report = run(cfg, dirs, None if args.split == "all" else args.split, args.out, adapter, args.cache, args.cross)
    print(to_markdown(report))
    print(f"wrote {args.out}/refinement.md, refinement.json, refinement_by_depth.png")
    return 0
