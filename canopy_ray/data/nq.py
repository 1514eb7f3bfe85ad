"""NQ-open oracle (``nq_open_oracle_*.jsonl.gz``) -> canonical items and questions.

Each record has ``question``, ``answers`` (short answers) and ``ctxs`` whose first entry
is the gold passage (``title``, ``text``). The gold passage becomes a text item split into
sentences (pysbd); identical passages are one item, id ``nq:<title-slug>:<hash>``.
Gold leaves = the sentences holding a short answer (SQuAD-normalised, whole-token match;
an answer the splitter cut in two gives the shortest window of sentences holding it); no
answer found -> the whole passage is gold, counted ``answer_not_in_passage``.

``candidates`` = the gold passage plus ``n_distractors`` other questions' passages, drawn
with ``random.Random(f"{seed}:{question id}")`` from the distinct passages of the file that
fall in the same split as the gold (:func:`canopy_ray.core.splits.split_of_key`: an NQ
question's split is its gold passage's), so a test question is never shown a passage that
trained the node encoder; the draw does not depend on the order of the other questions, and
is shuffled with the same generator so the gold is not always first. Question ids are
``nq:<record index>``.

``distractors="hard"`` draws them as a retriever would instead (:func:`hard_candidates`): the
passages of the same split nearest to the question by BM25 and, given ``embed``, by the frozen
encoder, in turn, those holding an answer left out. Random distractors from other questions
rarely share a topic with the question, so they cannot tell a method that ranks from one that
does not; retrieved ones do.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Iterable

import numpy as np

from canopy_ray.core.lexical import Bm25
from canopy_ray.core.metrics import answer_found
from canopy_ray.core.sentences import split_sentences
from canopy_ray.core.splits import item_key, split_of_key
from canopy_ray.data.records import BadLine, Malformed, Sink, Value, content_hash, locate_sentences, slug


def passage_id(title: str, text: str) -> str:
    return f"nq:{slug(title)}:{content_hash(title, text)}"


def _parse(index: int, record: Any) -> tuple[dict, dict, list[str]]:
    """(question without candidates, passage item, unlocated reasons) for one record."""
    if isinstance(record, BadLine):
        raise Malformed("bad_json")
    if not isinstance(record, dict):
        raise Malformed("not_an_object")
    text_q = record.get("question")
    if not isinstance(text_q, str) or not text_q.strip():
        raise Malformed("question_empty_question")
    answers = record.get("answers")
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise Malformed("bad_answers")
    ctxs = record.get("ctxs")
    if not isinstance(ctxs, list) or not ctxs or not isinstance(ctxs[0], dict):
        raise Malformed("no_gold_passage")
    title, text = ctxs[0].get("title", ""), ctxs[0].get("text")
    if not isinstance(title, str) or not isinstance(text, str) or not text.strip():
        raise Malformed("bad_gold_passage")
    sentences = split_sentences(text)
    item = {"id": passage_id(title, text), "modality": "text", "title": title, "sentences": sentences}
    values = [v for v in (Value.of(a) for a in answers) if v is not None]
    leaves = locate_sentences(sentences, values)
    question = {"id": f"nq:{index}", "question": text_q, "answers": answers,
                "gold": [{"item_id": item["id"], "leaves": leaves}]}
    return question, item, [] if leaves else ["answer_not_in_passage"]


def passage_split(pid: str) -> str:
    """The split of the questions whose gold passage is ``pid``. Distractors join groups
    (:func:`canopy_ray.core.splits.assign_splits`), but each is drawn from its gold's split,
    so every key of an NQ group hashes to one split, the one of each of its golds."""
    return split_of_key(item_key(pid))


def draw_candidates(gold_id: str, pool: list[str], qid: str, *, seed: int, n: int) -> list[str]:
    """The gold id plus ``n`` distinct other ids of ``pool`` (fewer if the pool is short), shuffled."""
    rng = random.Random(f"{seed}:{qid}")
    others = [p for p in pool if p != gold_id]
    chosen = [gold_id] + rng.sample(others, min(n, len(others)))
    rng.shuffle(chosen)
    return chosen


def hard_candidates(gold_id: str, question: dict, pool: list[str], texts: dict[str, str], *, n: int, bm25: Bm25,
                    dense: np.ndarray | None = None, rng: random.Random) -> list[str]:
    """The gold id plus the ``n`` passages of ``pool`` ranked nearest to the question, taken in
    turn from the BM25 ranking and the dense one (``dense``: the question's cosine with each
    pool passage), none holding one of the question's answers; shuffled."""
    rankings = [np.argsort(-np.asarray(bm25.scores(question["question"])), kind="stable")]
    if dense is not None:
        rankings.append(np.argsort(-dense, kind="stable"))
    chosen, seen = [gold_id], {gold_id}
    for k in (int(r[j]) for j in range(len(pool)) for r in rankings):
        if len(chosen) > n:
            break
        pid = pool[k]
        if pid not in seen:
            seen.add(pid)
            if not any(answer_found(texts[pid], a) for a in question["answers"]):
                chosen.append(pid)
    rng.shuffle(chosen)
    return chosen


def convert_nq(records: Iterable[Any], sink: Sink, *, seed: int = 0, n_distractors: int = 9,
               distractors: str = "random",
               embed: Callable[[list[str], list[str]], tuple[np.ndarray, np.ndarray]] | None = None) -> None:
    """``embed(questions, passages)``: unit vectors of both (the frozen encoder), for the dense
    half of ``distractors="hard"``; None: BM25 alone."""
    if distractors not in ("random", "hard"):
        raise ValueError(f"distractors must be random or hard, got {distractors!r}")
    parsed = sink.each(enumerate(records), lambda indexed: _parse(*indexed))
    by_id = {item["id"]: item for _, item, _ in parsed}
    pools: dict[str, list[str]] = {}  # distinct passages per split, in file order
    for pid in by_id:
        pools.setdefault(passage_split(pid), []).append(pid)
    texts, lexical, dense = {}, {}, {}  # hard: passage texts, BM25 per split, each question's cosines
    if distractors == "hard":
        texts = {pid: f"{it['title']}. {' '.join(it['sentences'])}" for pid, it in by_id.items()}
        lexical = {split: Bm25([texts[p] for p in pool]) for split, pool in pools.items()}
    if distractors == "hard" and embed is not None:
        for split, pool in pools.items():
            asked = [q for q, it, _ in parsed if passage_split(it["id"]) == split]
            qv, pv = embed([q["question"] for q in asked], [texts[p] for p in pool])
            dense |= {q["id"]: row for q, row in zip(asked, np.asarray(qv) @ np.asarray(pv).T)}
    for question, item, unlocated in parsed:
        split = passage_split(item["id"])
        pool = pools[split]
        if distractors == "hard":
            candidates = hard_candidates(item["id"], question, pool, texts, n=n_distractors, bm25=lexical[split],
                                         dense=dense.get(question["id"]), rng=random.Random(f"{seed}:{question['id']}"))
        else:
            candidates = draw_candidates(item["id"], pool, question["id"], seed=seed, n=n_distractors)
        if len(candidates) < n_distractors + 1:
            sink.note("fewer_distractors_than_asked")
        try:
            sink.emit(question | {"candidates": candidates}, [item], unlocated,
                      borrowed=[by_id[c] for c in candidates if c != item["id"]])
        except Malformed as e:
            sink.skip(e.reason)
