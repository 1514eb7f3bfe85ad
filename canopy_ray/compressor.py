"""The ``compress`` verb: a query and some items in, an evidence forest per item out.

Scoring is one dot product per node between the frozen query vector f0(q) and the node
vectors f_theta(v); node vectors come from a cache when the caller has one (they do not
depend on the query) and from the node encoder otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from canopy_ray.core.evidence import Piece, TokenCounter, count_words, node_text, piece, render
from canopy_ray.core.hierarchy import ItemTree, Node, Span, build_tree
from canopy_ray.core.items import Item
from canopy_ray.core.refine import decisions


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
    """Builds trees, gets node vectors (cache first), scores and refines."""

    def __init__(self, encoder, branching: int = 2, segment_s: float = 30.0, frame_every_s: float = 10.0,
                 max_frames: int = 32, count_tokens: TokenCounter = count_words,
                 node_cache: Callable[[ItemTree], np.ndarray | None] | None = None):
        self.encoder = encoder
        self.tree_args = dict(branching=branching, segment_s=segment_s, frame_every_s=frame_every_s,
                              max_frames=max_frames)
        self.count_tokens = count_tokens
        self.node_cache = node_cache

    @classmethod
    def from_config(cls, cfg, encoder, **kw) -> "Compressor":
        h = cfg.hierarchy
        return cls(encoder, h.branching, h.segment_s, h.frame_every_s, h.max_frames, **kw)

    def tree(self, item: Item, whole: bool = False, branching: int | None = None) -> ItemTree:
        args = self.tree_args | ({"branching": branching} if branching else {})
        return build_tree(item, whole=whole, **args)

    def node_vectors(self, trees: Sequence[ItemTree]) -> list[np.ndarray]:
        """Cached vectors where the cache has them; one encoder batch for the rest."""
        out: list[np.ndarray | None] = [self.node_cache(t) if self.node_cache else None for t in trees]
        misses = [i for i, v in enumerate(out) if v is None]
        if misses:
            pieces = [piece(trees[i], [n.span]) for i in misses for n in trees[i].nodes()]
            vecs = self.encoder.encode_nodes(pieces)
            at = 0
            for i in misses:
                n = len(trees[i].nodes())
                out[i], at = vecs[at:at + n], at + n
        return out  # type: ignore[return-value]

    def compress(self, query: str, items: Sequence[Item], branching: int | None = None,
                 query_vec: np.ndarray | None = None) -> list[ItemResult]:
        if query_vec is None:
            query_vec = self.encoder.encode_queries([query])[0]
        trees = [self.tree(it, branching=branching) for it in items]
        return [compress_tree(query_vec, t, v, self.count_tokens)
                for t, v in zip(trees, self.node_vectors(trees))]


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
