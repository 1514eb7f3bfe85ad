"""The helpers every converter shares: reading raw files, counting, ids and value matching.

:func:`read_records` yields the raw records of a JSON list or JSONL file (``.gz``
allowed); a :class:`Sink` validates what a converter emits and keeps the counts of its
:class:`ConvertReport`; :class:`Malformed` drops one record, :class:`ConvertError` the
whole input. :func:`slug` and :func:`content_hash` make the content-derived item ids;
:class:`Value`, :func:`parse_number`, :func:`numbers_in` and :func:`locate_sentences`
find the answer values that pin gold to leaves. The dispatcher is
:mod:`canopy_ray.data.convert`; the format modules (``hotpotqa``, ``nq``, ``tatqa``)
import from here only.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from canopy_ray.core.errors import CanopyError, ItemError
from canopy_ray.core.items import item_to_dict, parse_item, parse_question, question_to_dict
from canopy_ray.core.metrics import normalize_answer


class ConvertError(CanopyError):
    """The input as a whole cannot be read (missing file, not JSON at all, unknown format)."""


class Malformed(Exception):
    """One raw record is unusable; the converter counts ``reason`` and moves on."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class BadLine:
    """A line of a JSONL input that is not valid JSON (kept in the record stream so it is counted)."""

    lineno: int


@dataclass
class ConvertReport:
    format: str
    questions: int = 0
    items: int = 0
    duplicate_items: int = 0
    gold_located: int = 0
    gold_unlocated: int = 0
    unlocated: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    notes: Counter = field(default_factory=Counter)

    @property
    def located_share(self) -> float:
        total = self.gold_located + self.gold_unlocated
        return self.gold_located / total if total else 0.0

    def to_dict(self) -> dict:
        return {"format": self.format, "questions": self.questions, "items": self.items,
                "duplicate_items": self.duplicate_items, "gold_located": self.gold_located,
                "gold_unlocated": self.gold_unlocated, "located_share": round(self.located_share, 4),
                "unlocated": dict(sorted(self.unlocated.items())),
                "skipped": dict(sorted(self.skipped.items())),
                "notes": dict(sorted(self.notes.items()))}

    def summary(self) -> str:
        lines = [f"{self.format}: {self.questions} questions, {self.items} items "
                 f"({self.duplicate_items} duplicates merged)",
                 f"gold entries: {self.gold_located} located, {self.gold_unlocated} whole-item "
                 f"({100 * self.located_share:.1f}% located)"]
        for title, counts in (("unlocated", self.unlocated), ("skipped", self.skipped),
                              ("notes", self.notes)):
            for reason, n in sorted(counts.items()):
                lines.append(f"  {title}: {reason} = {n}")
        return "\n".join(lines)


class Sink:
    """Collects validated items (deduplicated by id) and questions, and keeps the counts."""

    def __init__(self, fmt: str):
        self.report = ConvertReport(fmt)
        self.items: dict[str, dict] = {}
        self.questions: list[dict] = []
        self._question_ids: set[str] = set()
        self._own: dict[str, None] = {}  # ids seen as own items, in order

    def emit(self, question: dict, items: Sequence[dict], unlocated: Iterable[str] = (),
             borrowed: Sequence[dict] = ()) -> None:
        """Validate a question with its items and store them all, or nothing.

        ``items`` are the question's own items (an identical one seen before as an own
        item counts in ``duplicate_items``); ``borrowed`` are items it only refers to
        (NQ distractors). Raises :class:`Malformed` (item or question invalid, a gold or
        candidate id that names no item); ``unlocated`` reasons are counted only once the
        question is kept.
        """
        canonical = []
        for obj in list(items) + list(borrowed):
            try:
                canonical.append(item_to_dict(parse_item(obj)))
            except ItemError as e:
                raise Malformed(f"item_{e.reason}") from e
        try:
            q = parse_question(question)
        except ItemError as e:
            raise Malformed(f"question_{e.reason}") from e
        if q.id in self._question_ids:
            raise Malformed("duplicate_question_id")
        new = {}
        for item in canonical:
            known = self.items.get(item["id"], new.get(item["id"]))
            if known is not None and known != item:  # content-derived ids: a hash collision
                raise Malformed("item_id_collision")
            new[item["id"]] = item
        referenced = [g.item_id for g in q.gold] + list(q.candidates)
        if any(i not in self.items and i not in new for i in referenced):
            raise Malformed("unknown_item")
        for item in canonical:
            self.items.setdefault(item["id"], item)
        for item in canonical[:len(items)]:
            if item["id"] in self._own:
                self.report.duplicate_items += 1
            self._own[item["id"]] = None
        self._question_ids.add(q.id)
        self.questions.append(question_to_dict(q))
        self.report.questions += 1
        for g in q.gold:
            if g.leaves:
                self.report.gold_located += 1
            else:
                self.report.gold_unlocated += 1
        for reason in unlocated:
            self.report.unlocated[reason] += 1

    def unlocated(self, reason: str, n: int = 1) -> None:
        self.report.unlocated[reason] += n

    def skip(self, reason: str) -> None:
        self.report.skipped[reason] += 1

    def note(self, reason: str, n: int = 1) -> None:
        self.report.notes[reason] += n

    def each(self, records: Iterable[Any], convert: Callable[[Any], Any]) -> list:
        """``convert(record)`` for every record, in order, the results kept; a record that
        raises :class:`Malformed` is skipped and counted, never fatal."""
        out = []
        for record in records:
            try:
                out.append(convert(record))
            except Malformed as e:
                self.skip(e.reason)
        return out

    def finish(self) -> tuple[list[dict], list[dict], ConvertReport]:
        """(items, questions, report); items in the order they first came as own items."""
        self.report.items = len(self.items)
        order = list(self._own) + [i for i in self.items if i not in self._own]
        return [self.items[i] for i in order], self.questions, self.report


# ---------------------------------------------------------------- reading raw files


def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def read_records(path: str | os.PathLike) -> Iterator[Any]:
    """Yield the raw records of a JSON list file or a JSONL file (``.gz`` allowed).

    A JSONL line that is not JSON is yielded as :class:`BadLine` so the converter counts
    it; a JSON list file that does not parse raises :class:`ConvertError`.
    """
    path = Path(path)
    if not path.is_file():
        raise ConvertError(f"input file not found: {path}")
    try:
        with _open_text(path) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConvertError(f"{path}: cannot read ({e})") from e
    if text.lstrip()[:1] == "[":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConvertError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from e
        yield from data
        return
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            yield BadLine(lineno)


# ---------------------------------------------------------------- shared helpers


def slug(text: str, max_len: int = 40) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s[:max_len].rstrip("-") or "untitled"


def content_hash(*parts: Any, n: int = 10) -> str:
    blob = json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha1(blob.encode("utf-8")).hexdigest()[:n]


NUMBER = re.compile(r"(?<![\d.])(?:\d{1,3}(?:,\d{3})+(?![\d])|\d+)(?:\.\d+)?")
_NUMBER_JUNK = re.compile(r"[\s$€£¥%,()\u2019'+\-\u2212\u2013\u2014]")


def parse_number(text: str) -> float | None:
    """A cell or answer that is one number once $, %, commas, parentheses, signs and spaces go."""
    s = _NUMBER_JUNK.sub("", text)
    if re.fullmatch(r"\d+(?:\.\d+)?|\.\d+", s):
        return round(float(s), 6)
    return None


def numbers_in(text: str) -> set[float]:
    """Every unsigned number written in ``text`` ("$ (1,234.5)" holds 1234.5)."""
    return {round(float(m.group().replace(",", "")), 6) for m in NUMBER.finditer(text)}


_POSSESSIVE = re.compile(r"(?<=\w)['\u2019]s\b")
_SPACED = re.compile(r"[\u2010-\u2015\u2212\u2018\u2019\u201c\u201d\u00ab\u00bb]")


def match_form(text: str) -> str:
    """SQuAD normalisation after dropping possessive 's and spacing out long dashes and
    curly quotes (not ASCII punctuation), so "Eminem's" holds "Eminem",
    "narrator\u2014Orwell" holds "Orwell" and "\u201cLWAY.\u201d" holds "LWAY"."""
    return normalize_answer(_SPACED.sub(" ", _POSSESSIVE.sub("", text)))


def _padded(text: str) -> str:
    return f" {match_form(text)} "


@dataclass(frozen=True)
class Value:
    """Something to look for: a number (matched numerically) or a text (SQuAD-normalised)."""

    text: str
    number: float | None = None

    @staticmethod
    def of(raw: Any) -> "Value | None":
        if isinstance(raw, bool) or raw is None:
            return None
        if isinstance(raw, (int, float)):
            return Value(format_number(raw), round(abs(float(raw)), 6))
        raw = str(raw)
        if not match_form(raw) and parse_number(raw) is None:
            return None
        return Value(raw, parse_number(raw))

    def in_text(self, text: str) -> bool:
        if self.number is not None and self.number in numbers_in(text):
            return True
        norm = match_form(self.text)
        return bool(norm) and f" {norm} " in _padded(text)


def format_number(x: int | float) -> str:
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def locate_sentences(sentences: Sequence[str], values: Iterable[Value]) -> list[int]:
    """Indexes of the sentences holding any value.

    A value found in no single sentence is looked for in the shortest window of
    consecutive sentences (an answer the splitter cut in two); every such window counts.
    """
    found: set[int] = set()
    for value in values:
        hits = [i for i, s in enumerate(sentences) if value.in_text(s)]
        if not hits:
            for width in range(2, len(sentences) + 1):
                hits = [j for i in range(len(sentences) - width + 1)
                        if value.in_text(" ".join(sentences[i:i + width]))
                        for j in range(i, i + width)]
                if hits:
                    break
        found.update(hits)
    return sorted(found)
