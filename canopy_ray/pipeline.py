"""The CANOPY loop for one question: retrieve, build trees, score, refine, critic, read.

Written once, async, against :class:`Backends`; :class:`LocalBackends` runs everything in
this process (tests, evaluation, the CLI) and ``canopy_ray.serve`` supplies backends that
call Ray Serve deployment handles, so both paths execute this same code.

Per round t (at most R): (optionally route: an LLM picks the modalities to search), encode
q_t with f0, retrieve the top k and skip those already in the evidence (the paper's rule:
a follow-up round may add fewer than k items; ``followup: fill`` adds k new ones; how many
of the top k were already there is recorded), classify each new table once from the
question (aggregation keeps it whole), refine every new item against q_t, append the kept
regions, truncate newest-first to the reader cap and ask the critic. Then the reader
answers from the evidence. The cap never lets a prompt outgrow the LLM's context
(``context_tokens``): it is lowered to the context less the prompt's own tokens and the reply's,
so an evidence too long is cut newest-first, never sent to fail. When the retriever holds no
item the evidence lacks (a small candidate set, all retrieved), no follow-up can change the
evidence, so the critic is not asked: the reader answers. With a multimodal LLM
(``llm.multimodal``) critic and reader also see the kept images and the frames of kept video segments as pixels, read under
``serve.media_root``, at most ``llm.max_images`` per prompt (newest evidence first); a text-only
LLM gets the same messages as ever (captions, transcripts, frame times as text).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Protocol, Sequence

import numpy as np

from canopy_ray.config import DEFAULT_POLICY
from canopy_ray.compressor import CompressOptions, Compressor, ItemResult
from canopy_ray.core.evidence import (Piece, TokenCounter, count_words, evidence_body, piece, render,
                                      render_evidence, truncate_newest_first)
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import Item, TableItem
from canopy_ray.core.policy import Policy
from canopy_ray.core.table_rules import table_kind
from canopy_ray.models.llm.roles import (Outcome, RoleCall, arun_role, critic_call, reader_call, router_call,
                                         table_call)

log = logging.getLogger(__name__)
# chat-template tokens around the messages (role markers), beyond their counted text
TEMPLATE_TOKENS = 32


@dataclass(frozen=True)
class Settings:
    k: int = 10
    rounds: int = 3
    branching: int = 2
    reader_token_cap: int = 16384
    video_token_cap: int = 65536  # the paper's cap for long video
    policy: Policy = Policy.parse(DEFAULT_POLICY)  # what compression scores and keeps (refinement.policy)
    classify_tables: bool = True
    table_classifier: str = "llm"  # or "rules" (no LLM call) or "whole" (every table kept whole)
    followup: str = "topk"  # or "fill"; see Pipeline._retrieve
    router: bool = False  # CANOPY-dagger: an LLM picks the modalities to search
    table_preview: int = 0  # table rows the classifier sees (the paper: 0, the question alone)
    multimodal: bool = False  # critic and reader see kept images and video frames as pixels
    max_images: int = 32  # images plus frames per prompt at most
    media_root: str | None = None  # media files are read only under it
    context_tokens: int | None = None  # the LLM's context window, when known; caps the evidence

    @classmethod
    def from_config(cls, cfg, **overrides) -> "Settings":
        from canopy_ray.models.llm.tokens import reader_context

        context = reader_context(cfg.llm)
        if context and cfg.critic.reader_token_cap > context:
            log.info("critic.reader_token_cap %d is larger than the LLM's context (%d tokens): the evidence "
                     "is cut to the context less the prompt and the answer", cfg.critic.reader_token_cap, context)
        base = dict(k=cfg.retrieval.k, rounds=cfg.critic.rounds, branching=cfg.hierarchy.branching,
                    reader_token_cap=cfg.critic.reader_token_cap, video_token_cap=cfg.critic.video_token_cap,
                    classify_tables=cfg.critic.classify_tables, table_classifier=cfg.critic.table_classifier,
                    followup=cfg.retrieval.followup,
                    router=cfg.critic.router, table_preview=cfg.critic.table_preview,
                    multimodal=cfg.llm.multimodal, max_images=cfg.llm.max_images, media_root=cfg.serve.media_root,
                    policy=cfg.policy, context_tokens=context)
        return cls(**(base | {k: v for k, v in overrides.items() if v is not None}))


class Backends(Protocol):
    """What the loop needs from the heavy parts; every call is awaited."""

    async def encode_queries(self, texts: Sequence[str]) -> np.ndarray: ...

    async def search(self, query_vec: np.ndarray, k: int,
                     modalities: Sequence[str] | None = None) -> list[tuple[str, float]]: ...

    async def fetch(self, item_ids: Sequence[str]) -> list[Item]: ...

    async def compress(self, query_vec: np.ndarray, items: Sequence[Item],
                       opts: CompressOptions) -> list[ItemResult]: ...

    async def llm(self, call: RoleCall) -> Outcome: ...


@dataclass
class Answer:
    question: str
    answer: str
    evidence: list[Piece]
    rounds: int
    queries: list[str]
    retrieved: list[list[str]]  # new item ids per round
    llm_calls: Counter = field(default_factory=Counter)
    llm_failures: Counter = field(default_factory=Counter)
    tokens: dict = field(default_factory=dict)
    timings: dict = field(default_factory=lambda: defaultdict(float))
    followup_seen: int = 0  # plain top-k hits of rounds >= 2 already in the evidence
    followup_total: int = 0
    results: list[ItemResult] = field(default_factory=list)
    answer_error: str | None = None  # why the reader failed ("<kind>: <detail>"), counted in llm_failures
    media: Counter = field(default_factory=Counter)  # multimodal: pictures sent, and skipped by reason

    @property
    def evidence_text(self) -> str:
        return render_evidence(self.evidence)

    @property
    def evidence_body(self) -> str:
        """The reader's evidence without the pieces' heads (titles, table header rows)."""
        return evidence_body(self.evidence)

    def to_dict(self) -> dict:
        return {
            # null when the reader gave nothing usable (its endpoint down, timing out, or a reply
            # that did not parse); the evidence is still returned, and answer_error says why
            "question": self.question, "answer": None if self.answer_error and not self.answer else self.answer,
            "answer_error": self.answer_error, "rounds": self.rounds, "queries": self.queries,
            "retrieved": self.retrieved,
            # ``text`` starts with ``head``: the item's title, and a table's header row
            "evidence": [{"item_id": p.item_id, "modality": p.modality, "spans": [list(s) for s in p.spans],
                          "round": p.round, "text": p.text, "head": p.head} for p in self.evidence],
            "llm_calls": dict(self.llm_calls), "llm_calls_total": sum(self.llm_calls.values()),
            "llm_failures": dict(self.llm_failures), "tokens": self.tokens,
            "timings": {k: round(v, 6) for k, v in self.timings.items()},
            "followup_seen": self.followup_seen, "followup_total": self.followup_total,
            **({"media": dict(self.media)} if self.media else {}),
        }


class Pipeline:
    def __init__(self, backends: Backends, settings: Settings = Settings(),
                 count_tokens: TokenCounter = count_words):
        self.backends, self.settings, self.count_tokens = backends, settings, count_tokens

    async def _timed(self, ans: Answer, stage: str, coro):
        t0 = time.perf_counter()
        try:
            return await coro
        finally:
            ans.timings[stage] += time.perf_counter() - t0

    async def _llm(self, ans: Answer, call: RoleCall) -> Outcome:
        out = await self._timed(ans, f"llm_{call.role}", self.backends.llm(call))
        ans.llm_calls[call.role] += 1
        if out.failed:
            ans.llm_failures[call.role] += 1
        return out

    async def answer(self, question: str, **overrides) -> Answer:
        s = replace(self.settings, **{k: v for k, v in overrides.items() if v is not None})
        t_start = time.perf_counter()
        ans = Answer(question, "", [], 0, [], [])
        seen: set[str] = set()
        pieces: list[Piece] = []
        reader_pieces: list[Piece] = []
        before = after = 0
        query = question
        pixels: dict = {}  # decoded media of this question, shared by critic and reader
        room = self._room(question, s)
        for t in range(1, s.rounds + 1):
            ans.rounds, ans.queries = t, ans.queries + [query]
            qvec = (await self._timed(ans, "encode", self.backends.encode_queries([query])))[0]
            new_ids = await self._retrieve(ans, query, qvec, seen, s)
            items = await self._timed(ans, "fetch", self.backends.fetch(new_ids))
            whole = await self._aggregation_tables(ans, question, items, s)
            opts = CompressOptions(policy=s.policy, branching=s.branching, whole=whole, round=t, query=query)
            results = await self._timed(ans, "compress", self.backends.compress(qvec, items, opts))
            ans.results.extend(results)
            before += sum(r.tokens_before for r in results)
            after += sum(r.tokens_after for r in results)
            pieces.extend(r.evidence for r in results if r.kept)  # an item left out adds nothing
            cap = s.video_token_cap if any(p.modality == "video" for p in pieces) else s.reader_token_cap
            reader_pieces = truncate_newest_first(pieces, min(cap, room), self.count_tokens)
            if t == s.rounds or await self._exhausted(seen):
                break
            images = await self._pictures(ans, reader_pieces, s, pixels)
            critique = (await self._llm(ans, critic_call(question, render_evidence(reader_pieces),
                                                         images=images))).value
            if critique.sufficient:
                break
            query = critique.next_query.strip() or question
        images = await self._pictures(ans, reader_pieces, s, pixels)
        reply = await self._llm(ans, reader_call(question, render_evidence(reader_pieces), images=images))
        ans.answer, ans.evidence = reply.value, reader_pieces
        ans.answer_error = reply.error if reply.failed else None
        # what compression cost (node-encoder tokens) beside what it saved (reader tokens)
        ans.tokens = {"before": before, "after": after,
                      "reader": self.count_tokens(render_evidence(reader_pieces)),
                      "encoded": sum(r.encoded_tokens for r in ans.results),
                      "nodes_encoded": sum(r.encoded for r in ans.results),
                      "nodes_total": sum(len(r.tree.nodes()) for r in ans.results)}
        ans.timings["total"] = time.perf_counter() - t_start
        return ans

    def _room(self, question: str, s: Settings) -> float:
        """Evidence tokens that fit the LLM's context beside the critic's or the reader's prompt
        and reply, whichever is longer (unbounded when the context is unknown)."""
        if not s.context_tokens:
            return float("inf")
        need = max(self.count_tokens("\n".join(m["content"] for m in call.messages)) + call.max_tokens
                   for call in (critic_call(question, ""), reader_call(question, "")))
        return max(0, s.context_tokens - need - TEMPLATE_TOKENS)

    async def _exhausted(self, seen: set[str]) -> bool:
        """Whether every item the retriever holds is in the evidence (known for small in-memory
        candidate sets only)."""
        unseen = getattr(self.backends, "unseen", None)
        return unseen is not None and await unseen(seen) == 0

    async def _pictures(self, ans: Answer, pieces: Sequence[Piece], s: Settings, pixels: dict) -> list:
        """The evidence's pictures for a multimodal LLM (none for a text-only one); files are
        read in a thread, once per question; what could not be read is counted in ``ans.media``."""
        if not s.multimodal or not any(p.media for p in pieces):
            return []
        from canopy_ray.models.llm.vision import evidence_pictures

        t0 = time.perf_counter()
        pictures, skipped = await asyncio.to_thread(evidence_pictures, pieces, s.media_root, s.max_images, pixels)
        ans.timings["media"] += time.perf_counter() - t0
        ans.media["sent"] += len(pictures)
        ans.media.update({f"skipped_{k}": v for k, v in skipped.items()})
        return pictures

    async def _retrieve(self, ans: Answer, query: str, qvec: np.ndarray, seen: set[str], s: Settings) -> list[str]:
        """The new item ids of this round. ``topk`` (the paper): the top k for ``query`` less
        those already in the evidence, so a follow-up may add fewer than k, or none; ``fill``:
        the first k items not yet seen. With the router on, one LLM call first picks the
        modalities to search (all of them when it fails)."""
        modalities = None
        if s.router:
            modalities = (await self._llm(ans, router_call(query))).value
        k = s.k if s.followup == "topk" else s.k + len(seen)
        hits = await self._timed(ans, "search", self.backends.search(qvec, k, modalities))
        top = [i for i, _ in hits[: s.k]]
        if ans.rounds > 1:
            ans.followup_seen += sum(i in seen for i in top)
            ans.followup_total += len(top)
        pool = top if s.followup == "topk" else [i for i, _ in hits]
        new_ids = [i for i in pool if i not in seen][: s.k]
        ans.retrieved.append(new_ids)
        seen.update(new_ids)
        return new_ids

    async def _aggregation_tables(self, ans: Answer, question: str, items: Sequence[Item],
                                  s: Settings) -> frozenset[str]:
        """Each new table's question classified (one LLM call each, or the rule, or none:
        ``whole``); aggregation questions keep the table whole. Only the policies that refine a tree
        ask (flat picks leaves, whole keeps every item)."""
        refines = s.policy.kind in ("canopy", "hybrid")
        tables = [it for it in items if isinstance(it, TableItem)] if s.classify_tables and refines else []
        if not tables or s.table_classifier == "whole":
            return frozenset(tb.id for tb in tables)
        if s.table_classifier == "rules":
            return frozenset(tb.id for tb in tables if table_kind(question) == "aggregation")
        outs = await asyncio.gather(*(self._llm(ans, table_call(question, _table_preview(tb, s.table_preview))) for tb in tables))
        return frozenset(tb.id for tb, o in zip(tables, outs) if o.value == "aggregation")

    def answer_sync(self, question: str, **overrides) -> Answer:
        return asyncio.run(self.answer(question, **overrides))


def _table_preview(table: TableItem, rows: int) -> str:
    return render(build_tree(table, whole=True), [(0, min(rows, len(table.rows)))]) if rows else ""


class LocalBackends:
    """Everything in this process: an encoder, a retriever, a compressor and a chat client."""

    def __init__(self, encoder, retriever, compressor: Compressor, chat_client):
        self.encoder, self.retriever, self.compressor, self.client = encoder, retriever, compressor, chat_client

    async def encode_queries(self, texts):
        return self.encoder.encode_queries(list(texts))

    async def search(self, query_vec, k, modalities=None):
        return self.retriever.search(np.asarray(query_vec, np.float32)[None, :], k, modalities)[0]

    async def fetch(self, item_ids):
        return self.retriever.items(item_ids)

    async def compress(self, query_vec, items, opts):
        return self.compressor.compress_items(query_vec, items, opts)

    async def llm(self, call):
        return await arun_role(self.client, call)

    async def unseen(self, seen: set[str]) -> int | None:
        """Items the retriever holds that are not in ``seen`` (None: unknown, an index)."""
        return len(set(self.retriever.ids) - seen) if isinstance(self.retriever, MemoryRetriever) else None


class MemoryRetriever:
    """Exact inner-product search over a few items held in memory (the "given" setting:
    a benchmark's candidate items for one question)."""

    def __init__(self, items: Sequence[Item], encoder, compressor: Compressor):
        self._items = {it.id: it for it in items}
        self.ids = list(self._items)
        roots = [compressor.tree(it, whole=True) for it in items]
        self.vectors = np.asarray(encoder.encode_items([piece(t, [t.root.span]) for t in roots]), np.float32)

    def search(self, queries: np.ndarray, k: int,
               modalities: Sequence[str] | None = None) -> list[list[tuple[str, float]]]:
        sims = np.asarray(queries, np.float32) @ self.vectors.T
        allowed = [modalities is None or self._items[i].modality in modalities for i in self.ids]
        out = []
        for row in sims:
            order = [i for i in np.argsort(-row, kind="stable") if allowed[i]][:k]
            out.append([(self.ids[i], float(row[i])) for i in order])
        return out

    def items(self, item_ids: Sequence[str]) -> list[Item]:
        return [self._items[i] for i in item_ids]
