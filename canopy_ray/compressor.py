"""The ``compress`` verb: a query and some items in, an evidence forest per item out.

Scoring is one dot product per node between the frozen query vector f0(q) and the node
vectors f_theta(v). Refinement reads only the scores of the nodes it visits, so nodes are
scored level by level (:func:`canopy_ray.core.refine.score_lazily`): every item's root in
one batch, then the children of every node that splits, and so on; nothing else is encoded.
A node's vector comes from the index's node store (items from that index), else from the
bounded vector cache (any node seen before), else from the node encoder.

The ``hybrid`` refinement mode (``refinement.mode``) ranks all the items' leaves together and lets
the parent-child rule decide how far up each chosen leaf's context reaches
(:func:`canopy_ray.core.refine.hybrid`); it scores every leaf in one batch, then only the parents
a chosen leaf may rise to (:func:`canopy_ray.core.refine.score_hybrid`); ``refinement.cutoff``
keeps, of the chosen share, only the leaves within it of the best. There, and in ``flat``,
``refinement.lexical`` adds to each cosine BM25 over all the nodes the mode ranks against
(:mod:`canopy_ray.core.lexical`); ``refinement.title`` adds its weight to every node of an item the
query names by title, and ``refinement.link`` to every node of an item that one of the two best items
(by their best leaf, every other term counted) or of the items the query names by title names.

With ``models.scorer`` a cross-encoder (:mod:`canopy_ray.models.cross`) reads the question and
each node's text together; ``refinement.cross`` weighs its score, added there too.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from canopy_ray.core.evidence import Piece, TokenCounter, count_words, node_text, piece, render
from canopy_ray.core.hierarchy import ItemTree, Node, Span, build_tree
from canopy_ray.core.items import Item
from canopy_ray.core.lexical import best_of, named, scaled_bm25, titled
from canopy_ray.core.refine import Ask, decisions, drive, fates, gate, hybrid, score_hybrid, score_lazily

MODES = ("canopy", "hybrid", "none", "flat")
NODE_ENCODERS = ("tuned", "frozen")


def refinement_of(mode: str, refinement: str | None, configured: str) -> str:
    """What a call in ``mode`` runs: ``canopy`` runs the requested refinement, else the configured
    one (Algorithm 1 or the hybrid); the other modes run themselves."""
    return (refinement or configured) if mode == "canopy" else mode


@dataclass(frozen=True)
class CompressOptions:
    """How one call compresses its items (travels as one value across a Serve handle).

    ``mode``: ``canopy`` (the compressor's refinement: Algorithm 1 or the hybrid), ``hybrid``,
    ``none`` (items passed whole) or ``flat`` (the ``flat_m`` best leaves); ``whole`` names items
    kept unsplit (aggregation tables); ``round`` tags the evidence; ``branching`` overrides B,
    ``margin`` the refinement margin (:mod:`canopy_ray.core.refine`), ``share`` the hybrid's
    share and ``gate`` the item gate (``inf``: off), ``refinement`` what ``canopy`` runs
    (``canopy``: Algorithm 1, ``hybrid``); None: the compressor's. ``query`` is the
    query's text, for BM25 and the title term beside the cosine (``Compressor.lexical``,
    ``title``). Serve's Refiner also reads ``node_encoder`` (``tuned`` f_theta or ``frozen`` f0)
    and ``use_store`` (take cached node vectors from the index: only for items that came from it).
    """

    branching: int | None = None
    whole: frozenset[str] = frozenset()
    mode: str = "canopy"
    flat_m: int = 5
    round: int = 1
    node_encoder: str = "tuned"
    use_store: bool = False
    margin: float | None = None
    share: float | None = None
    gate: float | None = None
    query: str = ""
    refinement: str | None = None

    def __post_init__(self):
        if self.margin is not None and not self.margin >= 0:
            raise ValueError(f"margin must be >= 0, got {self.margin!r}")
        if self.share is not None and not 0 < self.share <= 1:
            raise ValueError(f"share must be in (0, 1], got {self.share!r}")
        if self.gate is not None and not self.gate >= 0:
            raise ValueError(f"gate must be >= 0, got {self.gate!r}")
        if self.refinement not in (None, "canopy", "hybrid"):
            raise ValueError(f"refinement must be canopy or hybrid, got {self.refinement!r}")
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


def refined(tree: ItemTree, scores: dict[Span, float], count_tokens: TokenCounter = count_words,
            round: int = 1, margin: float = 0.0) -> ItemResult:
    """Algorithm 1 over the scores of the visited nodes (all nodes' scores work too)."""
    fate = decisions(tree.root, scores, margin)
    return _result(tree, scores, fate, [s for s, d in fate.items() if d == "kept"], count_tokens, round)


def flat(tree: ItemTree, scores: dict[Span, float], m: int, count_tokens: TokenCounter = count_words,
         round: int = 1) -> ItemResult:
    """The "flat" baseline: the item's m best-scoring leaves, no hierarchy."""
    leaves = [n.span for n in tree.nodes() if n.is_leaf]
    kept = sorted(sorted(leaves, key=lambda s: -scores[s])[:m])
    fate = {n.span: ("kept" if n.span in kept else "dropped") if n.is_leaf else "split" for n in tree.nodes()}
    return _result(tree, scores, fate, kept, count_tokens, round)


def _result(tree, scores, fate, kept, count_tokens, round) -> ItemResult:
    """An item with nothing kept (left out) gives no evidence and 0 tokens."""
    ev = piece(tree, kept, round)
    return ItemResult(tree, scores, fate, kept, count_tokens(render(tree, [tree.root.span])),
                      count_tokens(ev.text) if kept else 0, ev)


def chosen(tree: ItemTree, scores: dict[Span, float], kept: Sequence[Span], count_tokens: TokenCounter = count_words,
           round: int = 1) -> ItemResult:
    """The result of spans chosen other than by Algorithm 1 (the hybrid; ``[]``: left out)."""
    return _result(tree, scores, fates(tree.root, kept), list(kept), count_tokens, round)


def _score_leaves(roots: Sequence[Node]):
    """The flat baseline's scoring: every leaf of every tree, in one ask."""
    ask = [(i, n) for i, r in enumerate(roots) for n, _ in r.walk() if n.is_leaf]
    got = yield ask
    scores: list[dict[Span, float]] = [{} for _ in roots]
    for (i, n), s in zip(ask, got, strict=True):
        scores[i][n.span] = float(s)
    return scores


class _Scoring:
    """One call's scoring: vectors from the node store, the cache or the encoder, and counts."""

    def __init__(self, comp: "Compressor", trees: Sequence[ItemTree], query_vec: np.ndarray, query: str = "",
                 lexical: float = 0.0, cross: float = 0.0, leaves_only: bool = False, link: float = 0.0,
                 title: float = 0.0):
        self.comp, self.trees, self.lexical, self.cross, self.link = comp, trees, lexical, cross, link
        # the items the query names by title, matched only when a term reads them (not in canopy
        # mode, nor with paper-gpu.yaml): they get the title term, and the link term reads them too
        self.asked = titled([t.item.title for t in trees], query) if (title or link) and query else None
        self.titled = np.float32(title) * np.asarray(self.asked, np.float32) if title and self.asked else None
        self.named: np.ndarray | None = None  # per item, from the first ask (every ranked leaf)
        self.query = np.asarray(query_vec, np.float32)
        if cross and not query:
            raise ValueError("the cross-encoder's term needs the query's text (CompressOptions.query)")
        # BM25 of every node the mode ranks against (flat: the leaves; the hybrid: every node), all
        # at once: its statistics must not depend on which nodes a level asks for
        self.bm25: list[dict[Span, float]] = [{} for _ in trees]
        if lexical and query:
            nodes = [(i, n.span) for i, t in enumerate(trees) for n, _ in t.root.walk() if n.is_leaf or not leaves_only]
            for (i, span), v in zip(nodes, scaled_bm25(query, [node_text(trees[i], s) for i, s in nodes])):
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

    def scores(self, ask: Ask, found, fresh: np.ndarray, tokens: Sequence[int], pairs=None) -> np.ndarray:
        """Cosines of the asked nodes (the freshly encoded ones cached and counted), plus BM25, the
        cross-encoder's ``pairs`` scores, the title and the link terms by their weights."""
        vecs, todo, _, keys = found
        for k, vec, key, n in zip(todo, fresh, keys, tokens, strict=True):
            vecs[k] = vec
            if key is not None:
                self.comp.cache.put(key, vec)
            self.encoded[ask[k][0]] += 1
            self.tokens[ask[k][0]] += int(n)
        self.comp.stats["encoded"] += len(todo)
        self.comp.stats["encoded_tokens"] += int(sum(tokens))
        if not vecs:
            return np.zeros(0)
        cos = np.stack([np.asarray(v, np.float32) for v in vecs]) @ self.query
        if self.cross:
            cos = cos + np.float32(self.cross) * np.asarray(pairs, np.float32)
        if self.lexical and any(self.bm25):
            cos = cos + np.float32(self.lexical) * np.asarray([self.bm25[i][n.span] for i, n in ask], np.float32)
        if self.titled is not None:
            cos = cos + self.titled[[i for i, _ in ask]]
        if self.link:
            if self.named is None:  # the ranking modes ask for every leaf first (single-node items' too)
                best = best_of(len(self.trees), ((i, v) for (i, _), v in zip(ask, cos.tolist())))
                self.named = np.asarray(named([t.item.title for t in self.trees],  # these items' bodies only
                                              lambda i: piece(self.trees[i], [self.trees[i].root.span]).body, best,
                                              also=[i for i, hit in enumerate(self.asked or ()) if hit]),
                                        np.float32)
            cos = cos + np.float32(self.link) * self.named[[i for i, _ in ask]]
        return cos


class Compressor:
    """Builds trees, scores the nodes refinement visits, refines.

    ``node_store`` (``lookup(item_id) -> {span: vector} | None`` and ``usable_for(encoder)``)
    serves f_theta vectors cached at index time: use it only for items that came from the
    same index (a caller's own items may reuse an id with other content). ``cache`` (a
    :class:`~canopy_ray.models.vector_cache.VectorCache`) serves any node seen before by the
    same node encoder. The encoder needs ``encode_nodes``, ``token_counts`` and its identity
    (``model_id``, ``adapter_id``); an async caller passes its own encode function instead.
    ``stats`` counts nodes served by the store, by the cache, and encoded (with their tokens).
    ``margin``, ``mode``, ``share``, ``fallback``, ``lead``, ``cutoff``, ``gate``, ``lexical``, ``title`` and ``link`` are
    the config's ``refinement`` section (:class:`canopy_ray.config.RefinementConfig`); ``cross``
    weighs the cross-encoder's score (``models.scorer``: the encoder's ``score_nodes``, or the
    ``score`` a Serve caller passes) added in the one-ask modes.
    """

    def __init__(self, encoder, branching: int = 2, segment_s: float = 30.0, frame_every_s: float = 10.0,
                 max_frames: int = 32, count_tokens: TokenCounter = count_words, node_store=None, cache=None,
                 margin: float = 0.0, mode: str = "canopy", share: float = 0.5, gate: float = math.inf,
                 lexical: float = 0.0, fallback: float = 0.0, lead: bool = False, cross: float = 0.0,
                 link: float = 0.0, cutoff: float | None = None, title: float = 0.0):
        self.encoder, self.margin, self.mode, self.share, self.gate = encoder, margin, mode, share, gate
        self.cross, self.link, self.cutoff, self.title = cross, link, cutoff, title
        self.lexical, self.fallback, self.lead = lexical, fallback, lead
        self.tree_args = dict(branching=branching, segment_s=segment_s, frame_every_s=frame_every_s,
                              max_frames=max_frames)
        self.count_tokens = count_tokens
        self.node_store, self.cache = node_store, cache
        self.stats = {"store": 0, "cache": 0, "encoded": 0, "encoded_tokens": 0}

    @classmethod
    def from_config(cls, cfg, encoder, **kw) -> "Compressor":
        """A compressor with the config's hierarchy and, unless ``cache`` is given (shared),
        a vector cache of ``models.cache_mb``. ``refinement.cross`` applies to an encoder with a
        cross-encoder (``score_nodes``: f_theta with ``models.scorer``); f0 scores by cosine alone."""
        if "cache" not in kw and cfg.models.cache_mb:
            from canopy_ray.models.vector_cache import VectorCache

            kw["cache"] = VectorCache(cfg.models.cache_mb)
        h, r = cfg.hierarchy, cfg.refinement
        return cls(encoder, h.branching, h.segment_s, h.frame_every_s, h.max_frames, margin=cfg.margin,
                   mode=r.mode, share=r.share, gate=math.inf if r.gate is None else r.gate, lexical=r.lexical,
                   link=r.link, title=r.title, fallback=r.fallback, lead=r.lead, cutoff=r.cutoff,
                   **{"cross": r.cross if hasattr(encoder, "score_nodes") else 0.0} | kw)

    def tree(self, item: Item, whole: bool = False, branching: int | None = None) -> ItemTree:
        args = self.tree_args | ({"branching": branching} if branching else {})
        return build_tree(item, whole=whole, **args)

    def trees(self, items: Sequence[Item], opts: CompressOptions = CompressOptions()) -> list[ItemTree]:
        return [self.tree(it, whole=opts.mode == "none" or it.id in opts.whole, branching=opts.branching)
                for it in items]

    def _encode(self, pieces: Sequence[Piece]) -> tuple[np.ndarray, list[int]]:
        return self.encoder.encode_nodes(pieces), self.encoder.token_counts(pieces)

    def margin_of(self, opts: CompressOptions) -> float:
        return self.margin if opts.margin is None else opts.margin

    def mode_of(self, opts: CompressOptions) -> str:
        return refinement_of(opts.mode, opts.refinement, self.mode)

    def share_of(self, opts: CompressOptions) -> float:
        return self.share if opts.share is None else opts.share

    def _gate(self, opts: CompressOptions) -> float:
        return self.gate if opts.gate is None else opts.gate

    def _start(self, trees, opts: CompressOptions, query_vec):
        roots, mode = [t.root for t in trees], self.mode_of(opts)
        if mode == "flat":
            levels = _score_leaves(roots)
        elif mode == "hybrid":
            # the link term ranks items by their best leaf, a single-node item's root among them
            levels = score_hybrid(roots, self.share_of(opts), self.fallback, self.lead, singles=bool(self.link),
                                  cutoff=self.cutoff)
        else:
            levels = score_lazily(roots, self.margin_of(opts), lone=self._gate(opts) < math.inf)
        # BM25 and the cross-encoder's term go with the ranking modes; Algorithm 1 scores by cosine
        # alone, as the paper
        ranked = mode != "canopy"
        return _Scoring(self, trees, query_vec, opts.query, self.lexical if ranked else 0.0,
                        self.cross if ranked else 0.0, leaves_only=mode == "flat",
                        link=self.link if ranked else 0.0, title=self.title if ranked else 0.0), levels

    def _finish(self, run: _Scoring, scores: list[dict], opts: CompressOptions) -> list[ItemResult]:
        mode, count, t = self.mode_of(opts), self.count_tokens, opts.round
        if mode == "flat":
            results = [flat(tr, sc, opts.flat_m, count, t) for tr, sc in zip(run.trees, scores)]
        elif mode == "hybrid":
            kept = hybrid([tr.root for tr in run.trees], scores, self.share_of(opts), self.fallback, self.lead,
                          self.cutoff)
            results = [chosen(tr, sc, k, count, t) for tr, sc, k in zip(run.trees, scores, kept)]
        else:
            results = [refined(tr, sc, count, t, self.margin_of(opts)) for tr, sc in zip(run.trees, scores)]
            if self._gate(opts) < math.inf and results:  # items kept whole on purpose are never left out
                stay = gate([max(sc.values()) for sc in scores], self._gate(opts))
                results = [r if ok or r.id in opts.whole else chosen(r.tree, r.scores, [], count, t)
                           for r, ok in zip(results, stay)]
        return [replace(r, encoded=n, encoded_tokens=tok) for r, n, tok in zip(results, run.encoded, run.tokens)]

    def compress_items(self, query_vec: np.ndarray, items: Sequence[Item],
                       opts: CompressOptions = CompressOptions()) -> list[ItemResult]:
        """Compress items against a query vector (f0 of the query)."""
        run, levels = self._start(self.trees(items, opts), opts, query_vec)

        def score(ask: Ask) -> np.ndarray:
            found = run.lookup(ask)
            fresh, tokens = self._encode(found[2]) if found[2] else (np.zeros((0, 0)), [])
            pairs = self.encoder.score_nodes(opts.query, run.pieces(ask)) if run.cross else None
            return run.scores(ask, found, fresh, tokens, pairs)

        return self._finish(run, drive(levels, score), opts)

    async def acompress_items(self, query_vec: np.ndarray, items: Sequence[Item], opts: CompressOptions,
                              encode, score=None) -> list[ItemResult]:
        """:meth:`compress_items` with an awaitable ``encode(pieces) -> (vectors, token counts)``
        (a Serve deployment): one call per tree level, all items together; with ``cross``, the
        awaitable ``score(pieces)`` (the cross-encoder's scores against ``opts.query``) beside it."""
        run, levels = self._start(self.trees(items, opts), opts, query_vec)
        try:
            ask = next(levels)
            while True:
                found = run.lookup(ask)
                # asyncio.sleep(0, value): an awaitable of value, made only when it is awaited
                encoded = encode(found[2]) if found[2] else asyncio.sleep(0, (np.zeros((0, 0)), []))
                scored = score(run.pieces(ask)) if run.cross else asyncio.sleep(0)
                (fresh, tokens), pairs = await asyncio.gather(encoded, scored)
                ask = levels.send(run.scores(ask, found, fresh, tokens, pairs))
        except StopIteration as done:
            return self._finish(run, done.value, opts)

    def compress(self, query: str, items: Sequence[Item], branching: int | None = None,
                 margin: float | None = None, refinement: str | None = None) -> list[ItemResult]:
        return self.compress_items(self.encoder.encode_queries([query])[0], items,
                                   CompressOptions(branching=branching, margin=margin, query=query,
                                                   refinement=refinement))


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
        score = result.scores.get(node.span)  # flat scores leaves only
        lines.append(f"{'  ' * depth}[{marks[fate]}] {node.span[0]}-{node.span[1]} "
                     f"{'   n/a ' if score is None else f'{score:+.4f}'}  {text}")
        if fate == "split":  # only split nodes had their children looked at
            for child in node.children:
                visit(child, depth + 1)

    visit(result.tree.root, 0)
    return "\n".join(lines)
