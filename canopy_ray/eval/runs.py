"""One method over one question set: per-question records and aggregates with intervals.

A *run* is (data set, method, pipeline settings) over a fixed sample of questions, in the
**given** setting (each question's candidate items are its whole corpus: a
:class:`~canopy_ray.pipeline.MemoryRetriever` over them) or the **open** setting (retrieval
from an index opened with :func:`canopy_ray.index.load_index`; its cached node vectors are
used when they match the node encoder).

Per question (:func:`question_record`):

- ``em``, ``f1``: the reader's answer against the gold answers (SQuAD normalisation);
- ``answer_kept``, the headline: a gold answer occurs in the evidence the reader received, the
  titles and table header rows of the items kept included (an item left out takes its title with
  it), over the questions whose shown items, whole, hold an answer (``answerable``; none yes/no;
  :func:`~canopy_ray.core.metrics.kept_answer`);
- ``answer_recall``: a gold answer occurs in the *body* of the evidence the reader received
  (reader-free; :func:`~canopy_ray.core.metrics.answer_recall`; the titles-aside figure): each piece without its head,
  the item's title and a table's header row (:func:`~canopy_ray.core.evidence.head`), which
  every method keeps, so an answer there says nothing about compression. One- and
  two-character answers are found only as a whole token (a number or a cell); a question
  with several gold answers (alternatives, or the spans of a multi-span answer) is found
  when any one of them is. ``answer_recall_informative``: the same over the *informative*
  questions only (``informative``: a gold answer, none yes/no, none found in the head of a
  candidate or retrieved item; undefined elsewhere); ``answer_recall_short``: the same over
  the informative questions with a one- or two-character gold answer (``short``), reported
  apart so their number shows; ``answer_recall_titled``: over the whole evidence, heads
  included;
- three gold-evidence recalls over the located gold leaves (``question.gold``; whole-item gold
  entries are left out), named apart because they answer different questions:
  ``refinement_recall`` (the paper's): of the gold leaves of the gold items *shown to
  refinement* (retrieved), the share inside the kept spans; aggregated **micro** (kept over
  shown, summed over questions: ``refinement_kept`` / ``refinement_gold``), undefined for a
  question whose gold items were all missed; ``evidence_recall`` (end to end, retrieval and
  refinement): the share of *all* its gold leaves that are kept, a gold item never retrieved
  counting as missed, averaged per question; ``retrieval_recall``: the share of its gold items
  retrieved at all;
- ``kept_tokens``: per retrieved item, the tokens of its evidence piece (the budget the
  matched-budget baselines replay, :mod:`canopy_ray.eval.matched`);
- ``tokens`` (reader evidence), ``tokens_before``/``tokens_after`` (of every retrieved item,
  before/after compression), ``llm_calls``, ``llm_failures``, ``rounds``;
- ``followup_seen_share``: of the plain top-k of rounds >= 2, the share already in the evidence
  (undefined for one-round answers);
- ``latency_<stage>`` (encode, search, fetch, compress, llm_critic, llm_reader, llm_table,
  total) in seconds. LLM calls answered from the cache are charged the latency they had
  when first made, so cached reruns report the same cost as the first run.

:func:`aggregate` gives each metric's mean over the questions where it is defined with a
percentile bootstrap 95% interval (questions resampled); :func:`paired_differences` the mean
per-question difference between two runs on the same questions, with its interval.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from canopy_ray.compressor import Compressor
from canopy_ray.core.evidence import TokenCounter, head, piece
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import Item, Question, iter_jsonl, parse_question
from canopy_ray.core.splits import in_split, sample_questions
from canopy_ray.core.metrics import (answer_recall, bootstrap_ci, covered, exact_match, f1_score, informative,
                                    is_short, kept_answer, paired_difference_ci, ratio_ci)
from canopy_ray.eval.cache import CachingEncoder
from canopy_ray.eval.matched import ReplayBackends
from canopy_ray.eval.methods import Method
from canopy_ray.models.llm.protocol import ChatResult
from canopy_ray.pipeline import Answer, LocalBackends, MemoryRetriever, Pipeline, Settings

SETTINGS = ("given", "open")
STAGES = ("encode", "search", "fetch", "compress", "llm_critic", "llm_reader", "llm_table", "total")
# Metrics aggregated per run, in report order; ``higher`` says which direction is better.
METRICS = ("em", "f1", "answer_kept", "answer_recall", "answer_recall_informative", "answer_recall_short", "answer_recall_titled",
           "refinement_recall", "evidence_recall", "retrieval_recall", "tokens", "tokens_before",
           "tokens_after", "nodes_encoded", "encoded_tokens", "llm_calls", "llm_failures", "rounds",
           "followup_seen_share",
           *(f"latency_{s}" for s in STAGES))
HIGHER_IS_BETTER = {"em", "f1", "answer_kept", "answer_recall", "answer_recall_informative", "answer_recall_short",
                    "answer_recall_titled", "refinement_recall", "evidence_recall", "retrieval_recall"}
# micro-averaged: the metric's aggregate is sum(numerator) / sum(denominator) over questions
MICRO = {"refinement_recall": ("refinement_kept", "refinement_gold")}


# ---------------------------------------------------------------- question sets


@dataclass
class EvalSet:
    """A named, fixed sample of questions and (given setting) the items they refer to."""

    name: str
    questions: list[Question]
    items: dict[str, Item] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)
    split: str | None = None
    seed: int = 0

    @property
    def ids_digest(self) -> str:
        return hashlib.sha1("\n".join(q.id for q in self.questions).encode()).hexdigest()[:12]


def _read_jsonl(path: str | Path, parse) -> tuple[list, Counter]:
    good, bad = [], Counter()
    with open(path, encoding="utf-8") as f:
        for _, obj in iter_jsonl(f, parse):
            if isinstance(obj, Exception):
                bad[getattr(obj, "reason", "error")] += 1
            else:
                good.append(obj)
    return good, bad


def load_eval_set(name: str, questions_path: str | Path, corpus_path: str | Path | None = None, *,
                  n: int | None = None, seed: int = 0, setting: str = "given",
                  split: str | None = None) -> EvalSet:
    """Read a canonical questions file, draw the sample and (given setting) load the candidates.

    ``split`` (train/validation/test) keeps only that split of
    :func:`canopy_ray.core.splits.assign_splits` (by document), so evaluation never reads a
    document that trained or tuned the node encoder.
    Given setting: questions without candidates are skipped (``no_candidates``).
    """
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    questions, skipped = _read_jsonl(questions_path, parse_question)
    skipped = Counter({f"question_{k}": v for k, v in skipped.items()})
    if split:
        questions = in_split(questions, split)
    if setting == "given":
        skipped["no_candidates"] += sum(not q.candidates for q in questions)
        questions = [q for q in questions if q.candidates]
    chosen = sample_questions(questions, n, seed)
    items: dict[str, Item] = {}
    if setting == "given":
        if corpus_path is None:
            raise ValueError("the given setting needs the corpus file holding the candidates")
        need = {c for q in chosen for c in q.candidates}
        from canopy_ray.core.items import parse_item

        with open(corpus_path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                obj = json.loads(line)
                if obj.get("id") in need:
                    items[obj["id"]] = parse_item(obj)
        missing = [q for q in chosen if any(c not in items for c in q.candidates)]
        if missing:
            raise ValueError(f"{len(missing)} questions name candidates missing from {corpus_path} "
                             f"(first: {missing[0].id})")
    return EvalSet(name, chosen, items, +skipped, split, seed)


# ---------------------------------------------------------------- per-question records


def _nan_to_none(x: float) -> float | None:
    return None if isinstance(x, float) and math.isnan(x) else x


def gold_recalls(question: Question, ans: Answer) -> dict:
    """The gold-evidence recalls of one answer (see the module docstring); NaN where undefined."""
    kept = {r.id: covered(r.kept) for r in ans.results}
    located = [g for g in question.gold if g.leaves]
    total = sum(len(g.leaves) for g in located)
    shown = [g for g in located if g.item_id in kept]
    shown_total = sum(len(g.leaves) for g in shown)
    hit = sum(len(set(g.leaves) & kept[g.item_id]) for g in shown)
    items = {g.item_id for g in question.gold}
    return {"refinement_recall": hit / shown_total if shown_total else math.nan,
            "refinement_kept": hit, "refinement_gold": shown_total,
            "evidence_recall": hit / total if total else math.nan,
            "retrieval_recall": len(items & set(kept)) / len(items) if items else math.nan}


def question_record(question: Question, ans: Answer, saved_s: Mapping[str, float] | None = None,
                    cache_hits: int = 0, reader: bool = True, heads: Iterable[str] = (),
                    whole: Iterable[str] = ()) -> dict:
    """The per-question record: identifiers, what happened, and every metric of :data:`METRICS`.

    ``reader=False``: the reader was skipped (:class:`SkipReader`), so EM/F1 are undefined and
    the skipped call is not counted. ``heads`` and ``whole``: of the question's candidates (given
    setting; :func:`~canopy_ray.core.evidence.head` and :func:`whole_text`); the retrieved items'
    are added here."""
    saved_s = saved_s or {}
    shown = {*heads, *(head(r.tree.item) for r in ans.results)}
    wholes = [*whole, *(piece(r.tree, [r.tree.root.span]).text for r in ans.results)]
    useful = informative(question.answers, shown)
    short = any(is_short(a) for a in question.answers)
    body = answer_recall(ans.evidence_body, question.answers) if question.answers else None
    scored = reader and bool(question.answers)
    recalls = {k: _nan_to_none(v) for k, v in gold_recalls(question, ans).items()}
    latency = {s: float(ans.timings.get(s, 0.0)) for s in STAGES}
    for role, s in saved_s.items():  # cached LLM calls cost what they cost the first time
        latency[f"llm_{role}"] = latency.get(f"llm_{role}", 0.0) + s
        latency["total"] += s
    rec = {
        "id": question.id, "question": question.question, "answers": list(question.answers),
        "prediction": ans.answer if reader else None,
        "em": exact_match(ans.answer, question.answers) if scored else None,
        "f1": f1_score(ans.answer, question.answers) if scored else None,
        "answer_kept": kept_answer(question.answers, ans.evidence_text, wholes),
        "answer_recall": body, "informative": useful, "short": short,
        "answer_recall_informative": body if useful else None,
        "answer_recall_short": body if useful and short else None,
        "answer_recall_titled": answer_recall(ans.evidence_text, question.answers) if question.answers else None,
        **recalls,
        "tokens": ans.tokens.get("reader", 0), "tokens_before": ans.tokens.get("before", 0),
        "tokens_after": ans.tokens.get("after", 0),
        "nodes_encoded": ans.tokens.get("nodes_encoded", 0), "encoded_tokens": ans.tokens.get("encoded", 0),
        "llm_calls": sum(ans.llm_calls.values()) - (0 if reader else ans.llm_calls.get("reader", 0)),
        "llm_failures": sum(ans.llm_failures.values()),
        "rounds": ans.rounds,
        "followup_seen_share": ans.followup_seen / ans.followup_total if ans.followup_total else None,
        **{f"latency_{s}": round(v, 4) for s, v in latency.items()},
        "llm_calls_by_role": {r: n for r, n in ans.llm_calls.items() if reader or r != "reader"},
        "llm_failures_by_role": dict(ans.llm_failures),
        "llm_cache_hits": cache_hits, "queries": ans.queries, "retrieved": ans.retrieved,
        "kept": {r.id: [list(s) for s in r.kept] for r in ans.results},
        "kept_tokens": {r.id: r.tokens_after for r in ans.results},
    }
    return rec


def whole_text(item: Item) -> str:
    """An item as its own piece, whole: its title and every region."""
    tree = build_tree(item, whole=True)
    return piece(tree, [tree.root.span]).text


def metric_values(records: Iterable[Mapping], metric: str) -> list[float]:
    out = []
    for r in records:
        v = r.get(metric)
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            out.append(float(v))
    return out


def aggregate(records: Sequence[Mapping], metrics: Sequence[str] = METRICS, n_boot: int = 2000,
              seed: int = 0) -> dict:
    """``{metric: {mean, low, high, n}}`` over the questions where the metric is defined; a
    :data:`MICRO` metric is its ratio of sums, the interval resampling questions (``n``: the
    questions that contribute to the denominator)."""
    out = {}
    for m in metrics:
        if m in MICRO and any(MICRO[m][1] in r for r in records):
            num, den = (metric_values(records, f) for f in MICRO[m])
            out[m] = _finite(ratio_ci(num, den, n_boot=n_boot, seed=seed).as_dict()) | {"n": sum(d > 0 for d in den)}
            continue
        vals = metric_values(records, m)
        out[m] = _finite(bootstrap_ci(vals, n_boot=n_boot, seed=seed).as_dict()) | {"n": len(vals)}
    return out


def _finite(d: dict) -> dict:
    """NaN (no defined values) -> None, so run files stay strict JSON."""
    return {k: _nan_to_none(v) for k, v in d.items()}


def paired_differences(a: Sequence[Mapping], b: Sequence[Mapping], metrics: Sequence[str] = METRICS,
                       n_boot: int = 2000, seed: int = 0) -> dict:
    """``{metric: {mean, low, high, n}}`` of a - b over questions (by id) where both are defined."""
    bid = {r["id"]: r for r in b if "error" not in r}
    out = {}
    for m in metrics:
        pairs = [(ra.get(m), bid[ra["id"]].get(m)) for ra in a if ra["id"] in bid and "error" not in ra]
        pairs = [(x, y) for x, y in pairs if x is not None and y is not None
                 and not (isinstance(x, float) and math.isnan(x)) and not (isinstance(y, float) and math.isnan(y))]
        xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
        out[m] = _finite(paired_difference_ci(xs, ys, n_boot=n_boot, seed=seed).as_dict()) | {"n": len(pairs)}
    return out


# ---------------------------------------------------------------- running


class SkipReader:
    """A chat client that answers the reader role with an empty answer without calling the
    model (other roles go through): reader-independent sweeps (tokens, answer recall, gold
    recall) at no reader cost. One-round methods then make no LLM call at all."""

    def __init__(self, client):
        self.client, self.model = client, getattr(client, "model", "")

    @staticmethod
    def _is_reader(response_format) -> bool:
        try:
            return response_format["json_schema"]["name"] == "canopy_reader"
        except (TypeError, KeyError):
            return False

    def chat(self, messages, *, response_format=None, max_tokens=None):
        if self._is_reader(response_format):
            return ChatResult('{"answer": ""}', "stop", 0, 0, "skipped")
        return self.client.chat(messages, response_format=response_format, max_tokens=max_tokens)

    async def achat(self, messages, *, response_format=None, max_tokens=None):
        if self._is_reader(response_format):
            return ChatResult('{"answer": ""}', "stop", 0, 0, "skipped")
        return await self.client.achat(messages, response_format=response_format, max_tokens=max_tokens)


class Runner:
    """Models loaded once (encoder, chat client, optional index); runs methods over question sets.

    ``client`` is any chat client (``achat``); a :class:`~canopy_ray.eval.cache.CachedChatClient`
    is recognised and its cache hits are recorded per question.
    """

    def __init__(self, cfg, client, *, encoder=None, index=None, count_tokens: TokenCounter | None = None):
        from canopy_ray.models.encoder import build_encoder, frozen_nodes
        from canopy_ray.models.llm.tokens import token_counter

        count_tokens = count_tokens or token_counter(cfg.llm)  # the reader's tokens

        encoder = encoder or build_encoder(cfg.models)
        self.cfg, self.client, self.index, self.count_tokens = cfg, client, index, count_tokens
        self.encoder = CachingEncoder(encoder)
        frozen = frozen_nodes(encoder)
        self.frozen_encoder = self.encoder if frozen is encoder else CachingEncoder(frozen)
        self._compressors: dict = {}
        self._references: dict = {}  # shipped's records per (sample, settings, setting, index)
        self.random_seed = 0  # the random baseline's leaves: seeded per (this, question, item)
        self.vector_cache = None  # one node-vector cache for every method, point and index
        if cfg.models.cache_mb:
            from canopy_ray.models.vector_cache import VectorCache

            self.vector_cache = VectorCache(cfg.models.cache_mb)

    def config_sha(self) -> str:
        return hashlib.sha256(self.cfg.model_dump_json().encode()).hexdigest()[:12]

    def compressor(self, frozen: bool, index=None) -> Compressor:
        """One compressor per node encoder and index (an index's cached node vectors are used
        only when they were made by that node encoder: ``NodeStore.usable_for``)."""
        key = (frozen, id(index) if index is not None else None)
        if key not in self._compressors:
            enc = self.frozen_encoder if frozen else self.encoder
            store = index.nodes if index is not None else None
            self._compressors[key] = Compressor.from_config(self.cfg, enc, count_tokens=self.count_tokens,
                                                            node_store=store, cache=self.vector_cache)
        return self._compressors[key]

    def node_adapter_id(self, method: Method) -> str:
        return (self.frozen_encoder if method.frozen else self.encoder).adapter_id

    def base_settings(self) -> Settings:
        return Settings.from_config(self.cfg)

    def _retriever(self, eval_set: EvalSet, question: Question, index):
        if index is not None:
            return index
        items = [eval_set.items[c] for c in question.candidates]
        return MemoryRetriever(items, self.encoder, self.compressor(False))

    def _reference_key(self, eval_set: EvalSet, settings: Settings, setting: str, index) -> tuple:
        if setting == "open" and index is None:  # the runner's own, as arun searches it
            index = self.index
        return (eval_set.name, eval_set.ids_digest, settings, setting,
                id(index) if setting == "open" else None)

    def reference(self, eval_set: EvalSet, settings: Settings, setting: str = "given", index=None) -> dict:
        """shipped's records (by question id) for this sample and settings, which the matched-budget
        methods replay: those of a shipped run made earlier by this runner, else one
        made now without the reader (the reader comes last, so the trajectory is the same)."""
        from canopy_ray.eval.methods import get_method

        key = self._reference_key(eval_set, settings, setting, index)
        if key not in self._references:
            self.run(eval_set, get_method("shipped"), settings, setting, index=index, reader=False)
        return self._references[key]

    def add_reference(self, eval_set: EvalSet, settings: Settings, run: Mapping, setting: str = "given",
                      index=None) -> None:
        """Use a finished shipped run (a run JSON) as the reference of the matched-budget methods,
        when it was made on this sample, with these settings and this node encoder."""
        from canopy_ray.eval.methods import get_method

        spec = run["spec"]
        # a settings field the run does not record is newer than the run: its default applied
        want = {k: v for k, v in spec_settings(settings).items() if k in spec or spec_settings(Settings())[k] != v}
        problems = [f"{k}: {spec.get(k)!r} != {v!r}" for k, v in
                    {"method": "shipped", "dataset": eval_set.name, "setting": setting,
                     "question_ids": eval_set.ids_digest, "node_adapter": self.node_adapter_id(get_method("shipped")),
                     **want}.items() if spec.get(k) != v]
        if problems:
            raise ValueError("the reference run does not match: " + "; ".join(problems))
        self._references[self._reference_key(eval_set, settings, setting, index)] = {r["id"]: r for r in run["records"]}

    async def arun(self, eval_set: EvalSet, method: Method, settings: Settings, setting: str = "given",
                   progress=None, index=None, reader: bool = True, reference: Mapping | None = None) -> list[dict]:
        if setting != "open":
            index = None
        else:
            index = index if index is not None else self.index
            if index is None:
                raise ValueError("the open setting needs an index (Runner(index=load_index(dir)))")
        if method.matched and reference is None:
            raise ValueError(f"method {method.name!r} replays a shipped run: pass its records as reference")
        enc = self.frozen_encoder if method.frozen else self.encoder
        comp = self.compressor(method.frozen, index)
        client = self.client if reader else SkipReader(self.client)
        records = []
        for i, q in enumerate(eval_set.questions):
            hits0 = getattr(self.client, "hits", 0)
            saved0 = Counter(getattr(self.client, "saved_s", {}))
            try:
                retriever = self._retriever(eval_set, q, index)
                if method.matched:
                    ref = reference.get(q.id)
                    if ref is None or "error" in ref:
                        raise ValueError(f"no shipped record to replay for {q.id}")
                    backends = ReplayBackends(method.matched, ref, enc, retriever, comp, client,
                                              seed=self.random_seed, question_id=q.id)
                else:
                    backends = LocalBackends(enc, retriever, comp, client)
                ans = await Pipeline(backends, settings, self.count_tokens).answer(q.question)
            except Exception as e:  # one broken question must not sink a run; it is counted
                records.append({"id": q.id, "question": q.question, "error": f"{type(e).__name__}: {e}"})
                continue
            if method.matched:  # the replayed critic made no call; follow-ups are shipped's
                ans.llm_calls.pop("critic", None)
                ans.llm_failures.pop("critic", None)
                ans.timings.pop("llm_critic", None)
                ans.followup_seen = ans.followup_total = 0
            saved = Counter(getattr(self.client, "saved_s", {}))
            saved.subtract(saved0)
            shown = [eval_set.items[c] for c in q.candidates if c in eval_set.items]
            records.append(question_record(q, ans, +saved, getattr(self.client, "hits", 0) - hits0, reader,
                                           [head(it) for it in shown], [whole_text(it) for it in shown]))
            if progress:
                progress(i + 1, len(eval_set.questions))
        return records

    def refinement(self) -> dict:
        """The configured policy (``shipped``'s; an auto margin resolved) and Algorithm 1's margin."""
        return {"policy": str(self.cfg.policy), "margin": self.cfg.margin}

    def run(self, eval_set: EvalSet, method: Method, settings: Settings | None = None, setting: str = "given",
            progress=None, index=None, reader: bool = True) -> dict:
        """A finished run: ``{spec, records, aggregate, errors, wall_s}``. A matched-budget method
        replays shipped's run of the same sample and settings (:meth:`reference`)."""
        from canopy_ray.models.llm.tokens import counter_name

        settings = settings or method.settings(self.base_settings())
        t0 = time.perf_counter()
        reference = self.reference(eval_set, settings, setting, index) if method.matched else None
        records = asyncio.run(self.arun(eval_set, method, settings, setting, progress, index, reader, reference))
        good = [r for r in records if "error" not in r]
        if method.name == "shipped":
            self._references[self._reference_key(eval_set, settings, setting, index)] = {r["id"]: r for r in records}
        return {
            "spec": run_spec(eval_set, method, settings, setting, self.node_adapter_id(method),
                             getattr(self.client, "model", "")) | {"reader": reader,
                                                                   "tokens_in": counter_name(self.cfg.llm),
                                                                   "config_sha": self.config_sha(),
                                                                   "refinement": self.refinement()},
            "aggregate": aggregate(good),
            "errors": len(records) - len(good),
            "wall_s": round(time.perf_counter() - t0, 2),
            "records": records,
        }


def spec_settings(settings: Settings) -> dict:
    """The settings as a run's spec records them (JSON: the policy as its text)."""
    return dataclasses.asdict(settings) | {"policy": str(settings.policy)}


def run_spec(eval_set: EvalSet, method: Method, settings: Settings, setting: str, adapter_id: str,
             llm_model: str = "") -> dict:
    """What a run's results depend on; a sweep reruns a point only when this changes."""
    candidates = Counter(len(q.candidates) for q in eval_set.questions)
    return {"dataset": eval_set.name, "method": method.name, "setting": setting, **spec_settings(settings),
            "node_adapter": adapter_id, "llm_model": llm_model, "split": eval_set.split, "seed": eval_set.seed,
            "n_questions": len(eval_set.questions), "question_ids": eval_set.ids_digest,
            "candidates": {str(k): v for k, v in sorted(candidates.items())}}


def comparison(runs: Mapping[str, dict], baseline: str = "shipped", metrics: Sequence[str] = METRICS) -> dict:
    """Paired differences of every run against ``baseline`` (``method - baseline``)."""
    if baseline not in runs:
        return {}
    base = runs[baseline]["records"]
    return {name: paired_differences(run["records"], base, metrics)
            for name, run in runs.items() if name != baseline}
