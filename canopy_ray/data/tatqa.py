"""TAT-QA (``tatqa_dev.json``) -> canonical items and questions.

A document is a table (``table.table``: rows of cells, header rows first) plus
paragraphs (``uid``, ``order``, ``text``) and questions. The table becomes one table
item: :func:`header_row_count` decides how many leading rows are headers (at least
one), :func:`merge_header` joins them column-wise into one header, the rest are rows,
all padded to one width. Each paragraph becomes a text item split with pysbd. Ids are
content-derived (``tatqa:table:<hash>``, ``tatqa:text:<hash>``) so repeated paragraphs
are one item.

Gold per question:
- the table, when ``answer_from`` is ``table`` or ``table-text``: the rows holding a
  sought value (below), or the whole table (``table_value_not_found``);
- each paragraph named in ``rel_paragraphs`` (orders as strings): the sentences holding a
  sought value, or the whole paragraph (``paragraph_value_not_found``).
Sought values: for ``arithmetic``, the operands of ``derivation`` (constants such as
``/2`` or ``*100`` left out; the answer itself if there is no derivation); for
``count``, the names listed in ``derivation`` (``a##b``); for spans, the answer
values plus whatever ``derivation`` names. Numbers match numerically after $, %,
commas, parentheses, signs and spaces are stripped; text matches SQuAD-normalised
whole tokens. ``answers`` = the answer(s) as strings; ``candidates`` = table + paragraphs.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Sequence

from canopy_ray.core.errors import ItemError
from canopy_ray.core.items import parse_item
from canopy_ray.core.sentences import split_sentences
from canopy_ray.data.records import (NUMBER, BadLine, Malformed, Sink, Value, content_hash,
                                     format_number, locate_sentences, parse_number)

_YEAR = re.compile(r"(19|20)\d\d")
_LOCATE = re.compile(r"locate and analy[sz]e (.+?) in r\w{1,2} ?\d+", re.IGNORECASE)
_SMALL_DIVISORS = {str(n) for n in range(2, 13)}


# ---------------------------------------------------------------- the table


def _is_year(cell: str) -> bool:
    return bool(_YEAR.fullmatch(re.sub(r"\s", "", cell)))


def _is_data(cell: str) -> bool:
    """A cell that holds a figure (a year alone is a column label, not data)."""
    return parse_number(cell) is not None and not _is_year(cell)


def is_header_row(row: Sequence[str]) -> bool:
    """A row below the first that still belongs to the header.

    It holds no figure, and either its first cell is empty (a spanning label, a unit
    line such as "(in millions)", years) or every other non-empty cell is a year
    ("At December 31: | 2019 | 2018"). A labelled row with empty cells ("Revenue:") is a
    section row, not a header.
    """
    if not row or any(_is_data(c) for c in row):
        return False
    if not row[0].strip():
        return True
    rest = [c for c in row[1:] if c.strip()]
    return bool(rest) and all(_is_year(c) for c in rest)


def header_row_count(table: Sequence[Sequence[str]]) -> int:
    """How many leading rows form the header: the first row always, then every row that
    :func:`is_header_row`, leaving at least one data row."""
    n = 1
    while n < len(table) - 1 and is_header_row(table[n]):
        n += 1
    return n


def merge_header(rows: Sequence[Sequence[str]], width: int) -> list[str]:
    """Join the header rows column-wise (non-empty cells, top to bottom, with spaces)."""
    header = []
    for col in range(width):
        parts: list[str] = []
        for row in rows:
            cell = row[col].strip() if col < len(row) else ""
            if cell and (not parts or parts[-1] != cell):
                parts.append(cell)
        header.append(" ".join(parts))
    return header


def split_table(table: Sequence[Sequence[str]]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of a raw TAT-QA table, every row padded to the widest row."""
    width = max(len(r) for r in table)
    n = header_row_count(table)
    rows = [list(r) + [""] * (width - len(r)) for r in table[n:]]
    return merge_header(table[:n], width), rows


def _cells(raw: Any) -> list[list[str]]:
    if not isinstance(raw, list) or not raw or not all(isinstance(r, list) and r for r in raw):
        raise Malformed("table_malformed")
    out = []
    for row in raw:
        if not all(isinstance(c, (str, int, float)) and not isinstance(c, bool) for c in row):
            raise Malformed("table_malformed")
        out.append([c if isinstance(c, str) else format_number(c) for c in row])
    return out


# ---------------------------------------------------------------- what to look for


def derivation_values(derivation: str, answer_type: str) -> list[Value]:
    """The values a derivation names: operands of a formula, or row names."""
    d = derivation.strip()
    if not d:
        return []
    if "##" in d:
        names = d.split("##")
    elif m := _LOCATE.search(d):
        names = [m.group(1)]
    elif answer_type == "count":
        names = [d]
    else:
        values = []
        for m in NUMBER.finditer(d):
            before = d[:m.start()].rstrip()[-1:]
            token = m.group()
            if token in ("1", "100", "1000") and before in ("+", "-", "*", "/"):
                continue  # "x / y - 1", "* 100"
            if token in _SMALL_DIVISORS and before == "/":
                continue  # averages: "(a + b) / 2"
            values.append(Value(token, round(float(token.replace(",", "")), 6)))
        return values
    return [v for v in (Value.of(n.strip()) for n in names) if v is not None]


def answer_strings(answer: Any) -> list[str]:
    raw = answer if isinstance(answer, list) else [answer]
    out = []
    for a in raw:
        if isinstance(a, bool) or not isinstance(a, (str, int, float)):
            raise Malformed("bad_answer")
        s = a if isinstance(a, str) else format_number(a)
        if s.strip():
            out.append(s)
    return out


def sought_values(q: dict) -> list[Value]:
    answer_type = q.get("answer_type") or ""
    derivation = q.get("derivation") or ""
    if not isinstance(derivation, str):
        derivation = ""
    from_derivation = derivation_values(derivation, answer_type)
    answers = [v for v in (Value.of(a) for a in answer_strings(q.get("answer"))) if v is not None]
    if answer_type == "arithmetic":
        return from_derivation or answers
    if answer_type == "count":
        return from_derivation
    return answers + from_derivation


def locate_rows(rows: Sequence[Sequence[str]], values: Sequence[Value]) -> list[int]:
    return [i for i, row in enumerate(rows) if any(v.in_text(c) for c in row for v in values)]


# ---------------------------------------------------------------- documents


def _document(doc: Any, sink: Sink) -> None:
    if isinstance(doc, BadLine):
        raise Malformed("document_bad_json")
    if not isinstance(doc, dict):
        raise Malformed("document_not_an_object")
    table_obj = doc.get("table")
    raw_table = table_obj.get("table") if isinstance(table_obj, dict) else None
    questions = doc.get("questions")
    paragraphs = doc.get("paragraphs") or []
    if not isinstance(questions, list) or not isinstance(paragraphs, list):
        raise Malformed("document_bad_fields")

    table_item = None
    try:
        header, rows = split_table(_cells(raw_table))
        candidate = {"id": f"tatqa:table:{content_hash(header, rows)}", "modality": "table",
                     "title": "", "header": header, "rows": rows}
        parse_item(candidate)
        table_item = candidate
    except Malformed as e:
        sink.skip(e.reason)
    except ItemError as e:
        sink.skip(f"table_{e.reason}")

    para_items: dict[str, dict] = {}
    for p in paragraphs:
        if not isinstance(p, dict) or not isinstance(p.get("text"), str) or not p["text"].strip():
            sink.skip("paragraph_bad")
            continue
        order = str(p.get("order"))
        text = p["text"]
        para_items.setdefault(order, {"id": f"tatqa:text:{content_hash(text)}", "modality": "text",
                                      "title": "", "sentences": split_sentences(text)})
    own = ([table_item] if table_item else []) + list(para_items.values())
    if not own:
        sink.skip("document_empty")
        return
    candidates = list(dict.fromkeys(item["id"] for item in own))

    for q in questions:
        try:
            _question(q, table_item, para_items, candidates, own, sink)
            own = []  # the document's items count once, with its first kept question
        except Malformed as e:
            sink.skip(e.reason)


def _question(q: Any, table_item: dict | None, para_items: dict[str, dict], candidates: list[str],
              own: list[dict], sink: Sink) -> None:
    if not isinstance(q, dict):
        raise Malformed("not_an_object")
    qid = q.get("uid")
    if not isinstance(qid, str) or not qid:
        raise Malformed("missing_id")
    answers = answer_strings(q.get("answer"))
    answer_from = q.get("answer_from") or ""
    rel = q.get("rel_paragraphs") or []
    if not isinstance(rel, list):
        raise Malformed("bad_rel_paragraphs")
    values = sought_values(q)

    gold, unlocated = [], []
    if "table" in answer_from:
        if table_item is None:
            unlocated.append("table_unusable")
        else:
            leaves = locate_rows(table_item["rows"], values)
            gold.append({"item_id": table_item["id"], "leaves": leaves})
            if not leaves:
                unlocated.append("table_value_not_found")
    if "text" in answer_from and not rel:
        unlocated.append("no_rel_paragraphs")
    for order in dict.fromkeys(str(r) for r in rel):
        item = para_items.get(order)
        if item is None:
            unlocated.append("rel_paragraph_missing")
            continue
        if any(g["item_id"] == item["id"] for g in gold):
            continue  # two orders with the same text: one item
        leaves = locate_sentences(item["sentences"], values)
        gold.append({"item_id": item["id"], "leaves": leaves})
        if not leaves:
            unlocated.append("paragraph_value_not_found")
    borrowed = [] if own else ([table_item] if table_item else []) + list(para_items.values())
    sink.emit({"id": qid, "question": q.get("question"), "answers": answers, "gold": gold,
               "candidates": candidates}, own, unlocated, borrowed=borrowed)


def convert_tatqa(records: Iterable[Any], sink: Sink) -> None:
    sink.each(records, lambda doc: _document(doc, sink))
