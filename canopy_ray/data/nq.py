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
"""

from __future__ import annotations

import random
from typing import Any, Iterable

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


def convert_nq(records: Iterable[Any], sink: Sink, *, seed: int = 0, n_distractors: int = 9) -> None:
    parsed = sink.each(enumerate(records), lambda indexed: _parse(*indexed))
    by_id = {item["id"]: item for _, item, _ in parsed}
    pools: dict[str, list[str]] = {}  # distinct passages per split, in file order
    for pid in by_id:
        pools.setdefault(passage_split(pid), []).append(pid)
    for question, item, unlocated in parsed:
        pool = pools[passage_split(item["id"])]
        candidates = draw_candidates(item["id"], pool, question["id"], seed=seed, n=n_distractors)
        if len(candidates) < n_distractors + 1:
            sink.note("fewer_distractors_than_asked")
        try:
            sink.emit(question | {"candidates": candidates}, [item], unlocated,
                      borrowed=[by_id[c] for c in candidates if c != item["id"]])
        except Malformed as e:
            sink.skip(e.reason)
