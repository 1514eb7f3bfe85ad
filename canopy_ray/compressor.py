"""The ``compress`` verb: a query and some items in, an evidence forest per item out.

Scoring is one dot product per node between the frozen query vector f0(q) and the node
vectors f_theta(v); node vectors come from a cache when the caller has one (they do not
depend on the query) and from the node encoder otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from canopy_ray.core.evidence import Piece, TokenCounter, count_words, node_text, piece, render
from canopy_ray.core.hierarchy import ItemTree, Node, Span, build_tree
from canopy_ray.core.items import Item
from canopy_ray.core.refine import decisions

MODES = ("canopy", "none", "flat")
NODE_ENCODERS = ("tuned", "frozen")


@dataclass(frozen=True)
class CompressOptions:
    """How one call compresses its items (travels as one value across a Serve handle).

    ``mode``: ``canopy`` (refinement), ``none`` (items passed whole) or ``flat`` (the
    ``flat_m`` best leaves); ``whole`` names items kept unsplit (aggregation tables);
    ``round`` tags the evidence; ``branching`` overrides B. Serve's Refiner also reads
    ``node_encoder`` (``tuned`` f_theta or ``frozen`` f0) and ``use_store`` (take cached
    node vectors from the index: only for items that came from it).
    """

    branching: int | None = None
    whole: frozenset[str] = frozenset()
    mode: str = "canopy"
    flat_m: int = 5
    round: int = 1
    node_encoder: str = "tuned"
    use_store: bool = False

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.node_encoder not in NODE_ENCODERS:
            raise ValueError(f"node_encoder must be one of {NODE_ENCODERS}, got {self.node_encoder!r}")


@dataclass(frozen=True)
class ItemResult:
    tree: ItemTree
    scores: dict[Span, float]
    decisions: dict[Span, str]
    kept: list[Span]
    tokens_before: int
    tokens_after: int
    evidence: Piece

    @property
    def id(self) -> str:
        return self.tree.item.id

    def nodes(self) -> list[dict]:
        """Every node with its score and fate, in pre-order (the ``explain`` output)."""
        return [{"span": list(n.span), "depth": d, "score": self.scores[n.span],
                 "decision": self.decisions[n.span]} for n, d in self.tree.root.walk()]

    def to_dict(self, explain: bool = False) -> dict:
        """The per-item JSON of ``/v1/compress``, ``/v1/answer`` and ``canopy compress --json``."""
        out = {"id": self.id, "modality": self.tree.item.modality, "kept": [list(s) for s in self.kept],
               "tokens_before": self.tokens_before, "tokens_after": self.tokens_after,
               "evidence": self.evidence.text}
        if explain:
            out["nodes"] = self.nodes()
        return out

    @classmethod
    def from_dict(cls, tree: ItemTree, d: dict, round: int = 1) -> "ItemResult":
        """Back from :meth:`to_dict` with ``explain`` (``tree`` built as the server built it)."""
        kept = [tuple(s) for s in d["kept"]]
        return cls(tree, {tuple(n["span"]): n["score"] for n in d["nodes"]},
                   {tuple(n["span"]): n["decision"] for n in d["nodes"]}, kept, d["tokens_before"],
                   d["tokens_after"], piece(tree, kept, round))


def score_nodes(query_vec: np.ndarray, nodes: Sequence[Node], node_vecs: np.ndarray) -> dict[Span, float]:
    """Cosine of unit vectors: s(q, v) = f0(q) . f_theta(v)."""
    sims = np.asarray(node_vecs, dtype=np.float32) @ np.asarray(query_vec, dtype=np.float32)
    return {n.span: float(s) for n, s in zip(nodes, sims)}


def compress_tree(query_vec: np.ndarray, tree: ItemTree, node_vecs: np.ndarray,
                  count_tokens: TokenCounter = count_words, round: int = 1) -> ItemResult:
    scores = score_nodes(query_vec, tree.nodes(), node_vecs)
    fate = decisions(tree.root, scores)
    kept = [s for s, d in fate.items() if d == "kept"]
    ev = piece(tree, kept, round)
    return ItemResult(tree, scores, fate, kept, count_tokens(render(tree, [tree.root.span])),
                      count_tokens(ev.text), ev)


class Compressor:
    """Builds trees, gets node vectors (node store first), scores and refines.

    ``node_store`` (``lookup(item_id) -> {span: vector} | None`` and ``usable_for(encoder)``)
    serves f_theta vectors cached at index time; only items it does not hold, or holds for
    another adapter, are encoded, in one batch. Use it only for items that came from the
    same index: a caller's own items may reuse an id with other content.
    """

    def __init__(self, encoder, branching: int = 2, segment_s: float = 30.0, frame_every_s: float = 10.0,
                 max_frames: int = 32, count_tokens: TokenCounter = count_words, node_store=None):
        self.encoder = encoder
        self.tree_args = dict(branching=branching, segment_s=segment_s, frame_every_s=frame_every_s,
                              max_frames=max_frames)
        self.count_tokens = count_tokens
        self.node_store = node_store
        self.stats = {"hits": 0, "misses": 0}

    @classmethod
    def from_config(cls, cfg, encoder, **kw) -> "Compressor":
        h = cfg.hierarchy
        return cls(encoder, h.branching, h.segment_s, h.frame_every_s, h.max_frames, **kw)

    def tree(self, item: Item, whole: bool = False, branching: int | None = None) -> ItemTree:
        args = self.tree_args | ({"branching": branching} if branching else {})
        return build_tree(item, whole=whole, **args)

    def _lookup(self, trees: Sequence[ItemTree]) -> tuple[list[dict], list[tuple[int, Span]], list[Piece]]:
        """Cached vectors per tree, and the (tree, span) nodes still to encode with their pieces."""
        store = self.node_store if self.node_store is not None and self.node_store.usable_for(self.encoder) else None
        found = [dict((store.lookup(t.item.id) if store else None) or {}) for t in trees]
        missing = [(i, n.span) for i, t in enumerate(trees) for n in t.nodes() if n.span not in found[i]]
        self.stats["misses"] += len(missing)
        self.stats["hits"] += sum(len(t.nodes()) for t in trees) - len(missing)
        return found, missing, [piece(trees[i], [span]) for i, span in missing]

    @staticmethod
    def _stack(trees, found, missing, vecs) -> list[np.ndarray]:
        for (i, span), v in zip(missing, vecs):
            found[i][span] = v
        return [np.stack([np.asarray(f[n.span], np.float32) for n in t.nodes()]) for f, t in zip(found, trees)]

    def node_vectors(self, trees: Sequence[ItemTree]) -> list[np.ndarray]:
        """Per tree, its nodes' vectors in pre-order: cached where possible, one encoder batch for the rest."""
        found, missing, pieces = self._lookup(trees)
        vecs = self.encoder.encode_nodes(pieces) if pieces else []
        return self._stack(trees, found, missing, vecs)

    async def anode_vectors(self, trees: Sequence[ItemTree], encode_nodes) -> list[np.ndarray]:
        """:meth:`node_vectors` with an awaitable node encoder (a Serve deployment)."""
        found, missing, pieces = self._lookup(trees)
        vecs = await encode_nodes(pieces) if pieces else []
        return self._stack(trees, found, missing, vecs)

    def trees(self, items: Sequence[Item], opts: CompressOptions = CompressOptions()) -> list[ItemTree]:
        return [self.tree(it, whole=opts.mode == "none" or it.id in opts.whole, branching=opts.branching)
                for it in items]

    def finish(self, query_vec: np.ndarray, trees: Sequence[ItemTree], vecs: Sequence[np.ndarray],
               opts: CompressOptions = CompressOptions()) -> list[ItemResult]:
        if opts.mode == "flat":
            return [flat_tree(query_vec, t, v, opts.flat_m, self.count_tokens, opts.round)
                    for t, v in zip(trees, vecs)]
        return [compress_tree(query_vec, t, v, self.count_tokens, opts.round) for t, v in zip(trees, vecs)]

    def compress_items(self, query_vec: np.ndarray, items: Sequence[Item],
                       opts: CompressOptions = CompressOptions()) -> list[ItemResult]:
        """Compress items against a query vector (f0 of the query)."""
        trees = self.trees(items, opts)
        return self.finish(query_vec, trees, self.node_vectors(trees), opts)

    def compress(self, query: str, items: Sequence[Item], branching: int | None = None) -> list[ItemResult]:
        return self.compress_items(self.encoder.encode_queries([query])[0], items,
                                   CompressOptions(branching=branching))


def flat_tree(query_vec: np.ndarray, tree: ItemTree, node_vecs: np.ndarray, m: int,
              count_tokens: TokenCounter = count_words, round: int = 1) -> ItemResult:
    """The "flat" baseline: the item's m best-scoring leaves, no hierarchy."""
    scores = score_nodes(query_vec, tree.nodes(), node_vecs)
    leaves = [n.span for n in tree.nodes() if n.is_leaf]
    kept = sorted(sorted(leaves, key=lambda s: -scores[s])[:m])
    fate = {n.span: ("kept" if n.span in kept else "dropped") if n.is_leaf else "split" for n in tree.nodes()}
    ev = piece(tree, kept, round)
    return ItemResult(tree, scores, fate, kept, count_tokens(render(tree, [tree.root.span])),
                      count_tokens(ev.text), ev)


def format_forest(result: ItemResult, width: int = 72) -> str:
    """A readable tree: one line per visited node with its score and fate."""
    marks = {"kept": "KEEP ", "split": "split", "dropped": "drop "}
    lines = [f"{result.id} ({result.tree.item.modality}): "
             f"{result.tokens_before} -> {result.tokens_after} tokens"]

    def visit(node: Node, depth: int) -> None:
        fate = result.decisions[node.span]
        text = node_text(result.tree, node.span).replace("\n", " / ")
        if len(text) > width:
            text = text[: width - 3] + "..."
        lines.append(f"{'  ' * depth}[{marks[fate]}] {node.span[0]}-{node.span[1]} "
                     f"{result.scores[node.span]:+.4f}  {text}")
        if fate == "split":  # only split nodes had their children looked at
            for child in node.children:
                visit(child, depth + 1)

    visit(result.tree.root, 0)
    return "\n".join(lines)
