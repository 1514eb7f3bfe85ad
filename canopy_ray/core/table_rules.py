"""A deterministic table classifier: does a question need many rows of a table?

The paper asks an LLM once per new table whether the question is an *aggregation* (count, sum,
average, maximum, list all...: the table is kept whole) or a *lookup* (the table is refined like
any item). ``critic.table_classifier: rules`` asks this instead: no LLM call, the same label for
the same question on every run. Words that read an aggregate off one row ("total", "change",
"percentage") are not aggregation cues: the row that holds the total is a lookup.
"""

from __future__ import annotations

import re

AGGREGATION = re.compile(
    r"\b(how many|number of|count|sum of|in total|combined|add(?:ed)? up|average|mean of|"
    r"list (?:all|the)|all (?:the )?\w+ (?:that|which|whose|with)|each of|every|"
    r"highest|lowest|largest|smallest|maximum|minimum|most|least|top \d+|rank(?:ed|ing)?)\b", re.I)


def table_kind(question: str) -> str:
    """``aggregation`` when the question asks for an aggregate over rows, else ``lookup``."""
    return "aggregation" if AGGREGATION.search(question) else "lookup"
