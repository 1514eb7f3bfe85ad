"""The ``compress`` verb: a query and some items in, an evidence forest per item out.

What is scored and kept is the call's :class:`~canopy_ray.core.policy.Policy` (the config's
``refinement.policy`` unless a request names its own). A policy reads only the scores of the
nodes it visits, so nodes are scored level by level (:meth:`Policy.asks`: Algorithm 1 asks for
every item's root, then the children of every node that splits; the hybrid for every leaf, then
the parents a chosen leaf may rise to); nothing else is encoded. A node's score is
:func:`canopy_ray.core.scoring.compose` of the cosine of f0(q) and f_theta(v) and the policy's
terms (BM25, title, bridge, link and, with ``models.scorer``, the cross-encoder's probability;
the bridge term encodes one more query, after the first level). A node's
vector comes from the index's node store (items from that index), else from the bounded vector
cache (any node seen before), else from the node encoder.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from canopy_ray.config import DEFAULT_POLICY
from canopy_ray.core.evidence import Piece, TokenCounter, count_words, node_text, piece, render
from canopy_ray.core.hierarchy import ItemTree, Node, Span, build_tree
from canopy_ray.core.items import Item
from canopy_ray.core.lexical import titled
from canopy_ray.core.policy import Policy
from canopy_ray.core.refine import Ask, drive, fates
from canopy_ray.core.scoring import best_item, bridge_query, compose, lexical, linked

NODE_ENCODERS = ("tuned", "frozen")


@dataclass(frozen=True)
class CompressOptions:
    """How one call compresses its items (travels as one value across a Serve handle).

    ``policy``: what is scored and kept (None: the compressor's); ``whole`` names items kept
    unsplit (aggregation tables); ``round`` tags the evidence; ``branching`` overrides B;
    ``query`` is the query's text, for the policy's lexical and title terms. Serve's Refiner also
    reads ``node_encoder`` (``tuned`` f_theta or ``frozen`` f0) and ``use_store`` (take cached
    node vectors from the index: only for items that came from it).
    """

    policy: Policy | None = None
    branching: int | None = None
    whole: frozenset[str] = frozenset()
    round: int = 1
    node_encoder: str = "tuned"
    use_store: bool = False
    query: str = ""

    def __post_init__(self):
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
    encoded: int = 0  # nodes this call sent to the node encoder (not in a store or cache)
    encoded_tokens: int = 0  # the encoder's tokens of those nodes

    @property
    def id(self) -> str:
        return self.tree.item.id

    def nodes(self) -> list[dict]:
        """Every node with its fate and score, in pre-order (the ``explain`` output); nodes
        refinement never visited have no score (``None``): they were never encoded."""
        return [{"span": list(n.span), "depth": d, "score": self.scores.get(n.span),
                 "decision": self.decisions[n.span]} for n, d in self.tree.root.walk()]

    def to_dict(self, explain: bool = False) -> dict:
        """The per-item JSON of ``/v1/compress``, ``/v1/answer`` and ``canopy compress --json``."""
        out = {"id": self.id, "modality": self.tree.item.modality, "kept": [list(s) for s in self.kept],
               "tokens_before": self.tokens_before, "tokens_after": self.tokens_after,
               "evidence": self.evidence.text if self.kept else "", "nodes_total": len(self.tree.nodes()),
               "nodes_scored": len(self.scores), "nodes_encoded": self.encoded,
               "encoded_tokens": self.encoded_tokens}
        if explain:
            out["nodes"] = self.nodes()
        return out

    @classmethod
    def from_dict(cls, tree: ItemTree, d: dict, round: int = 1) -> "ItemResult":
        """Back from :meth:`to_dict` with ``explain`` (``tree`` built as the server built it)."""
        kept = [tuple(s) for s in d["kept"]]
        return cls(tree, {tuple(n["span"]): n["score"] for n in d["nodes"] if n["score"] is not None},
                   {tuple(n["span"]): n["decision"] for n in d["nodes"]}, kept, d["tokens_before"],
                   d["tokens_after"], piece(tree, kept, round))


def token_report(results: Sequence[ItemResult]) -> dict:
    """LLMLingua's summary of one compression: ``origin_tokens``, ``compressed_tokens`` and
    ``ratio`` (origin / compressed; LLMLingua prints it as "3.1x")."""
    origin, compressed = sum(r.tokens_before for r in results), sum(r.tokens_after for r in results)
    return {"origin_tokens": origin, "compressed_tokens": compressed, "ratio": origin / max(compressed, 1)}


def _result(tree, scores, fate, kept, count_tokens, round) -> ItemResult:
    """An item with nothing kept (left out) gives no evidence and 0 tokens."""
    ev = piece(tree, kept, round)
    return ItemResult(tree, scores, fate, kept, count_tokens(render(tree, [tree.root.span])),
                      count_tokens(ev.text) if kept else 0, ev)


def chosen(tree: ItemTree, scores: dict[Span, float], kept: Sequence[Span], count_tokens: TokenCounter = count_words,
           round: int = 1) -> ItemResult:
    """The result of the kept spans (``[]``: the item is left out)."""
    return _result(tree, scores, fates(tree.root, kept), list(kept), count_tokens, round)


class _Scoring:
    """One call's scoring: vectors from the node store, the cache or the encoder, and counts."""

    def __init__(self, comp: "Compressor", trees: Sequence[ItemTree], query_vec: np.ndarray, policy: Policy,
                 query: str = ""):
        self.comp, self.trees, self.terms = comp, trees, policy.terms
        self.query = np.asarray(query_vec, np.float32)
        if self.terms and not query:
            raise ValueError(f"the policy's terms ({policy}) need the query's text (CompressOptions.query)")
        titles = [t.item.title for t in trees]
        # the items the query names by title: the title term lifts them, the link term reads them
        self.asked = titled(titles, query) if self.terms.title or self.terms.link else []
        self.linked: np.ndarray | None = None  # per item, from the first ask (every ranked leaf)
        self.query_text = query
        self.bridge: np.ndarray | None = None  # f0 of the bridge query, from the first ask, and its item
        self.bridge_item = -1
        # BM25 of every node of every item, all at once (core.scoring.lexical)
        self.bm25: list[dict[Span, float]] = [{} for _ in trees]
        if self.terms.bm25:
            nodes = [(i, n.span) for i, t in enumerate(trees) for n, _ in t.root.walk()]
            for (i, span), v in zip(nodes, lexical(query, [node_text(trees[i], s) for i, s in nodes])):
                self.bm25[i][span] = v
        store = comp.node_store if comp.node_store is not None and comp.node_store.usable_for(comp.encoder) else None
        self.stored = [(store.lookup(t.item.id) or {}) if store else {} for t in trees]
        self.encoded = [0] * len(trees)
        self.tokens = [0] * len(trees)

    def lookup(self, ask: Ask) -> tuple[list, list[int], list[Piece], list]:
        """Vectors found for the asked nodes (None where missing), and what to encode."""
        cache, stats = self.comp.cache, self.comp.stats
        vecs, todo, pieces, keys = [], [], [], []
        for k, (i, node) in enumerate(ask):
            vec, key = self.stored[i].get(node.span), None
            if vec is not None:
                stats["store"] += 1
            else:
                p = piece(self.trees[i], [node.span])
                if cache is not None:
                    key = cache.key(self.comp.encoder, "node", p.text, p.media)
                    vec = cache.get(key)
                if vec is not None:
                    stats["cache"] += 1
                else:
                    todo.append(k)
                    pieces.append(p)
                    keys.append(key)
            vecs.append(vec)
        return vecs, todo, pieces, keys

    def pieces(self, ask: Ask) -> list[Piece]:
        return [piece(self.trees[i], [n.span]) for i, n in ask]

    def fill(self, ask: Ask, found, fresh: np.ndarray, tokens: Sequence[int]) -> np.ndarray:
        """The asked nodes' vectors, the freshly encoded ones cached and counted."""
        vecs, todo, _, keys = found
        for k, vec, key, n in zip(todo, fresh, keys, tokens, strict=True):
            vecs[k] = vec
            if key is not None:
                self.comp.cache.put(key, vec)
            self.encoded[ask[k][0]] += 1
            self.tokens[ask[k][0]] += int(n)
        self.comp.stats["encoded"] += len(todo)
        self.comp.stats["encoded_tokens"] += int(sum(tokens))
        return np.stack([np.asarray(v, np.float32) for v in vecs]) if vecs else np.zeros((0, len(self.query)))

    def bridge_text(self, ask: Ask, vecs: np.ndarray, pairs=None) -> str | None:
        """The bridge term's second query, when it is still to be encoded (the first ask: every
        leaf), else None; its item is the best by the terms before it."""
        if not self.terms.bridge or self.bridge is not None or not len(vecs):
            return None
        before = replace(self.terms, bridge=0.0, link=0.0)
        self.bridge_item = best_item([i for i, _ in ask], self._compose(ask, vecs, pairs, before))
        tree = self.trees[self.bridge_item]
        return bridge_query(self.query_text, piece(tree, [tree.root.span]).text)

    def scores(self, ask: Ask, vecs: np.ndarray, pairs=None) -> np.ndarray:
        """The asked nodes' scores (:func:`canopy_ray.core.scoring.compose`), ``pairs`` the
        cross-encoder's scores."""
        return self._compose(ask, vecs, pairs, self.terms) if len(vecs) else np.zeros(0)

    def _compose(self, ask: Ask, vecs: np.ndarray, pairs, terms) -> np.ndarray:
        item_of = [i for i, _ in ask]

        def link(partial: np.ndarray) -> np.ndarray:
            if self.linked is None:  # the ranking policies ask for every leaf first (single-node items' too)
                self.linked = linked([t.item.title for t in self.trees],
                                     lambda i: piece(self.trees[i], [self.trees[i].root.span]).body,
                                     zip(item_of, partial.tolist()), [i for i, hit in enumerate(self.asked) if hit])
            return self.linked

        def bridge(partial: np.ndarray) -> tuple[int, np.ndarray]:
            return self.bridge_item, vecs @ self.bridge

        return compose(vecs @ self.query, item_of, terms,
                       bm25=[self.bm25[i][n.span] for i, n in ask] if terms.bm25 else None, cross=pairs,
                       titled=self.asked, link=link, bridge=bridge)


class Compressor:
    """Builds trees, scores the nodes the policy asks for, keeps what it keeps.

    ``node_store`` (``lookup(item_id) -> {span: vector} | None`` and ``usable_for(encoder)``)
    serves f_theta vectors cached at index time: use it only for items that came from the
    same index (a caller's own items may reuse an id with other content). ``cache`` (a
    :class:`~canopy_ray.models.vector_cache.VectorCache`) serves any node seen before by the
    same node encoder. The encoder needs ``encode_nodes``, ``token_counts`` and its identity
    (``model_id``, ``adapter_id``), and ``score_nodes`` for a policy's cross term; an async
    caller passes its own functions instead. ``stats`` counts nodes served by the store, by the
    cache, and encoded (with their tokens). ``policy``: what a call without its own runs (the
    default is the config's ``refinement.policy``).
    """

    def __init__(self, encoder, branching: int = 2, segment_s: float = 30.0, frame_every_s: float = 10.0,
                 max_frames: int = 32, count_tokens: TokenCounter = count_words, node_store=None, cache=None,
                 policy: Policy | str = DEFAULT_POLICY):
        self.encoder, self.policy = encoder, Policy.parse(policy) if isinstance(policy, str) else policy
        self.tree_args = dict(branching=branching, segment_s=segment_s, frame_every_s=frame_every_s,
                              max_frames=max_frames)
        self.count_tokens = count_tokens
        self.node_store, self.cache = node_store, cache
        self.stats = {"store": 0, "cache": 0, "encoded": 0, "encoded_tokens": 0}

    @classmethod
    def from_config(cls, cfg, encoder, **kw) -> "Compressor":
        """A compressor with the config's hierarchy and policy and, unless ``cache`` is given
        (shared), a vector cache of ``models.cache_mb``."""
        if "cache" not in kw and cfg.models.cache_mb:
            from canopy_ray.models.vector_cache import VectorCache

            kw["cache"] = VectorCache(cfg.models.cache_mb)
        h = cfg.hierarchy
        return cls(encoder, h.branching, h.segment_s, h.frame_every_s, h.max_frames, **{"policy": cfg.policy} | kw)

    def tree(self, item: Item, whole: bool = False, branching: int | None = None) -> ItemTree:
        args = self.tree_args | ({"branching": branching} if branching else {})
        return build_tree(item, whole=whole, **args)

    def trees(self, items: Sequence[Item], opts: CompressOptions = CompressOptions()) -> list[ItemTree]:
        whole = self.policy_of(opts).kind == "whole"
        return [self.tree(it, whole=whole or it.id in opts.whole, branching=opts.branching) for it in items]

    def policy_of(self, opts: CompressOptions) -> Policy:
        return self.policy if opts.policy is None else opts.policy

    def _encode(self, pieces: Sequence[Piece]) -> tuple[np.ndarray, list[int]]:
        return self.encoder.encode_nodes(pieces), self.encoder.token_counts(pieces)

    def _start(self, items: Sequence[Item], opts: CompressOptions, query_vec):
        trees, policy = self.trees(items, opts), self.policy_of(opts)
        return _Scoring(self, trees, query_vec, policy, opts.query), policy.asks([t.root for t in trees])

    def _finish(self, run: _Scoring, scores: list[dict], opts: CompressOptions) -> list[ItemResult]:
        kept = self.policy_of(opts).keep([t.root for t in run.trees], scores)
        return [replace(chosen(tr, sc, k, self.count_tokens, opts.round), encoded=n, encoded_tokens=tok)
                for tr, sc, k, n, tok in zip(run.trees, scores, kept, run.encoded, run.tokens)]

    def compress_items(self, query_vec: np.ndarray, items: Sequence[Item],
                       opts: CompressOptions = CompressOptions()) -> list[ItemResult]:
        """Compress items against a query vector (f0 of the query)."""
        run, levels = self._start(items, opts, query_vec)
        if run.terms.cross and not hasattr(self.encoder, "score_nodes"):
            raise ValueError("the policy's cross term needs a cross-encoder (models.scorer)")
        if run.terms.bridge and not hasattr(self.encoder, "encode_queries"):
            raise ValueError("the policy's bridge term needs a query encoder (encode_queries)")

        def score(ask: Ask) -> np.ndarray:
            found = run.lookup(ask)
            fresh, tokens = self._encode(found[2]) if found[2] else (np.zeros((0, 0)), [])
            pairs = self.encoder.score_nodes(opts.query, run.pieces(ask)) if run.terms.cross else None
            vecs = run.fill(ask, found, fresh, tokens)
            if (text := run.bridge_text(ask, vecs, pairs)) is not None:
                run.bridge = np.asarray(self.encoder.encode_queries([text])[0], np.float32)
            return run.scores(ask, vecs, pairs)

        return self._finish(run, drive(levels, score), opts)

    async def acompress_items(self, query_vec: np.ndarray, items: Sequence[Item], opts: CompressOptions,
                              encode, score=None, query=None) -> list[ItemResult]:
        """:meth:`compress_items` with an awaitable ``encode(pieces) -> (vectors, token counts)``
        (a Serve deployment): one call per tree level, all items together; with a cross term, the
        awaitable ``score(pieces)`` (the cross-encoder's scores against ``opts.query``) beside it;
        with a bridge term, the awaitable ``query(text)`` (f0 of the bridge query) after the first."""
        run, levels = self._start(items, opts, query_vec)
        if run.terms.bridge and query is None:
            raise ValueError("the policy's bridge term needs the query encoder (acompress_items' query)")
        try:
            ask = next(levels)
            while True:
                found = run.lookup(ask)
                # asyncio.sleep(0, value): an awaitable of value, made only when it is awaited
                encoded = encode(found[2]) if found[2] else asyncio.sleep(0, (np.zeros((0, 0)), []))
                scored = score(run.pieces(ask)) if run.terms.cross else asyncio.sleep(0)
                (fresh, tokens), pairs = await asyncio.gather(encoded, scored)
                vecs = run.fill(ask, found, fresh, tokens)
                if (text := run.bridge_text(ask, vecs, pairs)) is not None:
                    run.bridge = np.asarray(await query(text), np.float32)
                ask = levels.send(run.scores(ask, vecs, pairs))
        except StopIteration as done:
            return self._finish(run, done.value, opts)

    def compress(self, query: str, items: Sequence[Item], branching: int | None = None,
                 policy: Policy | str | None = None) -> list[ItemResult]:
        policy = Policy.parse(policy) if isinstance(policy, str) else policy
        return self.compress_items(self.encoder.encode_queries([query])[0], items,
                                   CompressOptions(policy=policy, branching=branching, query=query))


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
        score = result.scores.get(node.span)  # a policy scores only the nodes it visits
        lines.append(f"{'  ' * depth}[{marks[fate]}] {node.span[0]}-{node.span[1]} "
                     f"{'   n/a ' if score is None else f'{score:+.4f}'}  {text}")
        if fate == "split":  # only split nodes had their children looked at
            for child in node.children:
                visit(child, depth + 1)

    visit(result.tree.root, 0)
    return "\n".join(lines)
