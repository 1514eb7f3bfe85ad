"""HotpotQA -> canonical items and questions.

Reads both layouts: the Hugging Face one (``context = {"title": [...], "sentences": [[...]]}``,
``supporting_facts = {"title": [...], "sent_id": [...]}``, ``id``) and the original one
(``context = [[title, [sentences]]]``, ``supporting_facts = [[title, idx]]``, ``_id``).

Each context paragraph is a text item whose sentences are kept exactly as given (no
re-splitting, leading spaces included). Identical paragraphs shared by questions become
one item with a content-derived id ``hotpotqa:<title-slug>:<hash>``. Gold = the supporting
facts as sentence indexes per paragraph; a fact whose index is out of range is counted
unlocated (its paragraph stays gold, whole if no fact of it is in range). ``candidates``
= the context paragraphs in the given order; ``answers`` = ``[answer]``.
"""

from __future__ import annotations

from typing import Any, Iterable

from canopy_ray.data.records import BadLine, Malformed, Sink, content_hash, slug


def paragraph_id(title: str, sentences: list[str]) -> str:
    return f"hotpotqa:{slug(title)}:{content_hash(title, sentences)}"


def _context(record: dict) -> list[tuple[str, list[str]]]:
    ctx = record.get("context")
    if isinstance(ctx, dict):
        titles, sents = ctx.get("title"), ctx.get("sentences")
        if not isinstance(titles, list) or not isinstance(sents, list) or len(titles) != len(sents):
            raise Malformed("bad_context")
        pairs = list(zip(titles, sents))
    elif isinstance(ctx, list):
        if not all(isinstance(p, list) and len(p) == 2 for p in ctx):
            raise Malformed("bad_context")
        pairs = [(p[0], p[1]) for p in ctx]
    else:
        raise Malformed("bad_context")
    for title, sentences in pairs:
        if not isinstance(title, str) or not isinstance(sentences, list) or not all(
                isinstance(s, str) for s in sentences):
            raise Malformed("bad_context")
    if not pairs:
        raise Malformed("empty_context")
    return pairs


def _facts(record: dict) -> list[tuple[str, int]]:
    sf = record.get("supporting_facts")
    if sf is None:
        return []
    if isinstance(sf, dict):
        titles, idxs = sf.get("title"), sf.get("sent_id")
        if not isinstance(titles, list) or not isinstance(idxs, list) or len(titles) != len(idxs):
            raise Malformed("bad_supporting_facts")
        facts = list(zip(titles, idxs))
    elif isinstance(sf, list) and all(isinstance(f, list) and len(f) == 2 for f in sf):
        facts = [(f[0], f[1]) for f in sf]
    else:
        raise Malformed("bad_supporting_facts")
    for title, idx in facts:
        if not isinstance(title, str) or isinstance(idx, bool) or not isinstance(idx, int):
            raise Malformed("bad_supporting_facts")
    return facts


def _question(record: Any, sink: Sink) -> None:
    if isinstance(record, BadLine):
        raise Malformed("bad_json")
    if not isinstance(record, dict):
        raise Malformed("not_an_object")
    qid = record.get("id", record.get("_id"))
    if not isinstance(qid, str) or not qid:
        raise Malformed("missing_id")
    answer = record.get("answer")
    if answer is not None and not isinstance(answer, str):
        raise Malformed("bad_answer")
    paragraphs = _context(record)
    facts = _facts(record)

    items = [{"id": paragraph_id(title, sentences), "modality": "text", "title": title,
              "sentences": sentences} for title, sentences in paragraphs]
    ids = [item["id"] for item in items]

    by_title: dict[str, int] = {}
    for pos, (title, _) in enumerate(paragraphs):
        by_title.setdefault(title, pos)  # a repeated title resolves to its first paragraph
    gold: dict[int, set[int]] = {}
    unlocated = []
    for title, idx in facts:
        pos = by_title.get(title)
        if pos is None:
            unlocated.append("title_not_in_context")
            continue
        leaves = gold.setdefault(pos, set())
        if 0 <= idx < len(paragraphs[pos][1]):
            leaves.add(idx)
        else:
            unlocated.append("sent_id_out_of_range")
    sink.emit({
        "id": qid, "question": record.get("question"),
        "answers": [answer] if answer is not None else [],
        "gold": [{"item_id": ids[pos], "leaves": sorted(leaves)} for pos, leaves in sorted(gold.items())],
        "candidates": list(dict.fromkeys(ids)),
    }, items, unlocated)


def convert_hotpotqa(records: Iterable[Any], sink: Sink) -> None:
    sink.each(records, lambda record: _question(record, sink))
