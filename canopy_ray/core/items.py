"""The canonical corpus item and question forms, validated on load.

One JSON form serves corpus files, jobs and the HTTP API. ``parse_item`` turns a
decoded JSON object into a frozen dataclass or raises :class:`ItemError` with a
short ``reason`` code that jobs count (``bad_json``, ``empty_text``,
``ragged_table``...).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Union

from canopy_ray.core.errors import ItemError
from canopy_ray.core.sentences import split_sentences

MODALITIES = ("text", "table", "image", "video")


@dataclass(frozen=True)
class TextItem:
    id: str
    title: str
    sentences: tuple[str, ...]
    modality: str = field(default="text", init=False)


@dataclass(frozen=True)
class TableItem:
    id: str
    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    modality: str = field(default="table", init=False)


@dataclass(frozen=True)
class ImageItem:
    id: str
    title: str
    path: str
    caption: str = ""
    modality: str = field(default="image", init=False)


@dataclass(frozen=True)
class TranscriptSpan:
    start: float
    end: float
    text: str


@dataclass(frozen=True)
class VideoItem:
    id: str
    title: str
    path: str
    duration_s: float
    transcript: tuple[TranscriptSpan, ...] = ()
    modality: str = field(default="video", init=False)


Item = Union[TextItem, TableItem, ImageItem, VideoItem]


@dataclass(frozen=True)
class Gold:
    """Gold evidence inside one item; empty ``leaves`` means the whole item is gold."""

    item_id: str
    leaves: tuple[int, ...] = ()


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    answers: tuple[str, ...] = ()
    gold: tuple[Gold, ...] = ()
    candidates: tuple[str, ...] = ()


def _str(obj: dict, key: str, item_id: str | None, *, required: bool = True,
         nonempty: bool = False, reason: str = "bad_field") -> str:
    value = obj.get(key)
    if value is None:
        if required:
            raise ItemError("missing_field", f"missing required field {key!r}", item_id)
        return ""
    if not isinstance(value, str):
        raise ItemError(reason, f"field {key!r} must be a string, got {type(value).__name__}", item_id)
    if nonempty and not value.strip():
        raise ItemError(reason, f"field {key!r} is empty", item_id)
    return value


def _number(obj: dict, key: str, item_id: str | None) -> float:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ItemError("bad_field", f"field {key!r} must be a finite number", item_id)
    return float(value)


def _cells(values: Any, what: str, item_id: str) -> tuple[str, ...]:
    if not isinstance(values, list):
        raise ItemError("bad_table", f"{what} must be a list of cells", item_id)
    cells = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise ItemError("bad_table", f"{what} has a cell of type {type(v).__name__}", item_id)
        cells.append(v if isinstance(v, str) else str(v))
    return tuple(cells)


def parse_item(obj: Any) -> Item:
    """Validate one decoded JSON object and return the typed item."""
    if not isinstance(obj, dict):
        raise ItemError("not_an_object", f"an item must be a JSON object, got {type(obj).__name__}")
    raw_id = obj.get("id")
    if isinstance(raw_id, int) and not isinstance(raw_id, bool):
        raw_id = str(raw_id)
    if not isinstance(raw_id, str) or not raw_id.strip():
        raise ItemError("missing_id", "an item needs a non-empty string 'id'")
    item_id = raw_id
    modality = obj.get("modality")
    if modality not in MODALITIES:
        raise ItemError("bad_modality", f"modality must be one of {MODALITIES}, got {modality!r}", item_id)
    title = _str(obj, "title", item_id, required=False)

    if modality == "text":
        if obj.get("sentences") is not None:
            sents = obj["sentences"]
            if not isinstance(sents, list) or not all(isinstance(s, str) for s in sents):
                raise ItemError("bad_field", "'sentences' must be a list of strings", item_id)
            if not any(s.strip() for s in sents):
                raise ItemError("empty_text", "all sentences are empty", item_id)
            return TextItem(item_id, title, tuple(sents))
        text = _str(obj, "text", item_id, reason="empty_text")
        if not text.strip():
            raise ItemError("empty_text", "field 'text' is empty", item_id)
        return TextItem(item_id, title, tuple(split_sentences(text)))

    if modality == "table":
        header = _cells(obj.get("header"), "header", item_id)
        if not header:
            raise ItemError("bad_table", "a table needs a non-empty 'header'", item_id)
        rows_in = obj.get("rows")
        if not isinstance(rows_in, list) or not rows_in:
            raise ItemError("empty_table", "a table needs a non-empty list 'rows'", item_id)
        rows = tuple(_cells(r, f"row {i}", item_id) for i, r in enumerate(rows_in))
        for i, row in enumerate(rows):
            if len(row) != len(header):
                raise ItemError("ragged_table",
                                f"row {i} has {len(row)} cells, the header has {len(header)}", item_id)
        return TableItem(item_id, title, header, rows)

    if modality == "image":
        path = _str(obj, "path", item_id, nonempty=True)
        return ImageItem(item_id, title, path, _str(obj, "caption", item_id, required=False))

    path = _str(obj, "path", item_id, nonempty=True)
    duration = _number(obj, "duration_s", item_id)
    if duration <= 0:
        raise ItemError("bad_video", "'duration_s' must be positive", item_id)
    spans = []
    for i, seg in enumerate(obj.get("transcript") or []):
        if not isinstance(seg, dict):
            raise ItemError("bad_video", f"transcript entry {i} must be an object", item_id)
        start, end = _number(seg, "start", item_id), _number(seg, "end", item_id)
        if not 0 <= start < end:
            raise ItemError("bad_video", f"transcript entry {i} needs 0 <= start < end", item_id)
        spans.append(TranscriptSpan(start, end, _str(seg, "text", item_id)))
    return VideoItem(item_id, title, path, duration, tuple(spans))


def item_to_dict(item: Item) -> dict:
    """The canonical JSON object of an item (text items always carry their sentences)."""
    base = {"id": item.id, "modality": item.modality, "title": item.title}
    if isinstance(item, TextItem):
        return base | {"sentences": list(item.sentences)}
    if isinstance(item, TableItem):
        return base | {"header": list(item.header), "rows": [list(r) for r in item.rows]}
    if isinstance(item, ImageItem):
        return base | {"path": item.path, "caption": item.caption}
    return base | {"path": item.path, "duration_s": item.duration_s,
                   "transcript": [{"start": s.start, "end": s.end, "text": s.text}
                                  for s in item.transcript]}


def parse_question(obj: Any) -> Question:
    if not isinstance(obj, dict):
        raise ItemError("not_an_object", "a question must be a JSON object")
    qid = obj.get("id")
    qid = str(qid) if isinstance(qid, int) and not isinstance(qid, bool) else qid
    if not isinstance(qid, str) or not qid:
        raise ItemError("missing_id", "a question needs a non-empty string 'id'")
    text = _str(obj, "question", qid, nonempty=True, reason="empty_question")
    answers = obj.get("answers") or []
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise ItemError("bad_field", "'answers' must be a list of strings", qid)
    gold = []
    for g in obj.get("gold") or []:
        if not isinstance(g, dict) or not isinstance(g.get("item_id"), str):
            raise ItemError("bad_field", "each gold entry needs a string 'item_id'", qid)
        leaves = g.get("leaves") or []
        if not isinstance(leaves, list) or not all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in leaves):
            raise ItemError("bad_field", "gold 'leaves' must be non-negative integers", qid)
        gold.append(Gold(g["item_id"], tuple(sorted(set(leaves)))))
    candidates = obj.get("candidates") or []
    if not isinstance(candidates, list) or not all(isinstance(c, str) for c in candidates):
        raise ItemError("bad_field", "'candidates' must be a list of item ids", qid)
    return Question(qid, text, tuple(answers), tuple(gold), tuple(candidates))


def question_to_dict(q: Question) -> dict:
    return {"id": q.id, "question": q.question, "answers": list(q.answers),
            "gold": [{"item_id": g.item_id, "leaves": list(g.leaves)} for g in q.gold],
            "candidates": list(q.candidates)}


def iter_jsonl(lines: Iterable[str], parse=parse_item) -> Iterator[tuple[int, Item | ItemError]]:
    """Yield ``(line_number, item_or_error)`` for each non-blank line; never raises on bad input."""
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield lineno, parse(json.loads(line))
        except json.JSONDecodeError as e:
            yield lineno, ItemError("bad_json", f"line {lineno}: invalid JSON ({e.msg})")
        except ItemError as e:
            yield lineno, e
