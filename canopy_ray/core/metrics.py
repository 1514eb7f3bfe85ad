"""Answer and refinement metrics, with bootstrap confidence intervals.

EM and F1 use the SQuAD answer normalisation (lower case, no punctuation, no articles,
single spaces) and take the best match over the gold answers.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from canopy_ray.core.hierarchy import Node, Span
from canopy_ray.core.pairs import preference_nodes

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(prediction: str, answers: Iterable[str]) -> float:
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(a) for a in answers))


def _f1(pred: str, gold: str) -> float:
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    if not p or not g:
        return float(p == g)
    common = sum((Counter(p) & Counter(g)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, answers: Iterable[str]) -> float:
    return max((_f1(prediction, a) for a in answers), default=0.0)


def accuracy(prediction: str, answer: str) -> float:
    """Multiple-choice accuracy: the normalised choice equals the normalised key."""
    return float(normalize_answer(prediction) == normalize_answer(answer))


SHORT = 2  # answers of at most this many characters (normalised) match whole tokens only
_TOKEN = re.compile(r"[^\s|]+")  # evidence tokens: whitespace and table cell bars split them
_OPEN, _CLOSE = "([{$€£+-−–\"'“‘", ")]}%,.;:!?\"'”’"
_NUMBER = re.compile(r"\d+(?:\.\d+)?|\.\d+")


def is_short(answer: str) -> bool:
    """An answer of one or two characters once normalised ("4", "-7", "0.4", "U.S."): a
    substring of almost any table or text, so it is found only as a whole token."""
    return 0 < len(normalize_answer(answer)) <= SHORT


def _token_key(token: str) -> float | str:
    """A token as a short answer is compared: signs, brackets, currency and trailing
    punctuation stripped; a number by its value ("(4)", "$4", "4%", "4.0" -> 4.0), anything
    else in lower case ("U.S." -> "u.s", never "us")."""
    t = token.lstrip(_OPEN).rstrip(_CLOSE)
    plain = t.replace(",", "")
    return float(plain) if _NUMBER.fullmatch(plain) else t.lower()


def answer_found(evidence: str, answer: str) -> bool:
    """Whether one gold answer occurs in ``evidence``: as whole words of the normalised
    evidence, or, for a :func:`is_short` answer, as one whole token (a number or a cell):
    "4" is found in "4", "(4)" or "| 4 |", never in "2014", "40", "1.4" or "4.5"."""
    norm = normalize_answer(answer)
    if not norm:
        return False
    if is_short(answer):
        key = _token_key("".join(answer.split()))
        return any(_token_key(t) == key for t in _TOKEN.findall(evidence))
    return f" {norm} " in f" {normalize_answer(evidence)} "


def answer_recall(evidence: str, answers: Iterable[str]) -> float:
    """1 when a gold answer occurs in the evidence (:func:`answer_found`), a reader-free check.
    Several gold answers count as found when **any** of them is: the question form does not
    tell alternative answers (NQ) from the spans of a multi-span answer (TAT-QA), so a
    multi-span question counts as found when one of its spans is."""
    return float(any(answer_found(evidence, a) for a in answers))


def answerable(answers: Iterable[str], whole: Iterable[str]) -> bool:
    """Whether a gold answer occurs in the items shown for a question, each whole with its title
    (``whole``: their texts), none of the answers yes/no (found in almost no text)."""
    answers = [a for a in answers if normalize_answer(a)]
    if not answers or any(normalize_answer(a) in ("yes", "no") for a in answers):
        return False
    return any(answer_recall(t, answers) for t in whole)


def kept_answer(answers: Sequence[str], evidence: str, whole: Iterable[str]) -> float | None:
    """The headline answer recall of one question: 1 when a gold answer occurs in the kept
    evidence (``evidence``: the kept pieces with the titles and header rows of the items kept;
    an item left out takes its title with it), 0 when not; None when the whole items hold no
    answer (:func:`answerable`): no method could keep one."""
    return answer_recall(evidence, answers) if answerable(answers, whole) else None


def informative(answers: Iterable[str], heads: Iterable[str]) -> bool:
    """The titles-aside figure's questions: a gold answer, none yes/no, and none found in the
    head of an item shown for it (:func:`canopy_ray.core.evidence.head`: the title, and a
    table's header row), so the body of the evidence alone decides."""
    answers = [a for a in answers if normalize_answer(a)]
    if not answers or any(normalize_answer(a) in ("yes", "no") for a in answers):
        return False
    return not any(answer_recall(h, answers) for h in heads)


def covered(spans: Iterable[Span]) -> set[int]:
    return {i for a, b in spans for i in range(a, b)}


@dataclass(frozen=True)
class RefinementStats:
    """Counts for one item; sums over items give micro-averages."""

    pref_nodes: int
    pref_correct: int
    gold_leaves: int
    gold_kept: int
    leaves: int
    leaves_kept: int

    @property
    def pruned(self) -> bool:
        return self.leaves_kept < self.leaves


def refinement_stats(root: Node, scores: Mapping[Span, float], kept: Iterable[Span],
                     gold_leaves: Iterable[int]) -> RefinementStats:
    gold = set(gold_leaves)
    nodes = preference_nodes(root, gold)
    keep = covered(kept)
    return RefinementStats(len(nodes), sum(n.correct(scores) for n in nodes),
                           len(gold), len(gold & keep), root.size, len(keep))


def decision_accuracy(stats: Sequence[RefinementStats]) -> float:
    n = sum(s.pref_nodes for s in stats)
    return sum(s.pref_correct for s in stats) / n if n else float("nan")


def gold_recall(stats: Sequence[RefinementStats]) -> float:
    n = sum(s.gold_leaves for s in stats)
    return sum(s.gold_kept for s in stats) / n if n else float("nan")


def pruned_share(stats: Sequence[RefinementStats]) -> float:
    return sum(s.pruned for s in stats) / len(stats) if stats else float("nan")


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float

    def as_dict(self) -> dict:
        return {"mean": self.mean, "low": self.low, "high": self.high}


def bootstrap_ci(values: Sequence[float], n_boot: int = 2000, level: float = 0.95,
                 seed: int = 0) -> Interval:
    """Mean with a percentile bootstrap interval (resampling questions with replacement),
    by :func:`scipy.stats.bootstrap`. No values: NaN throughout; values without spread (one
    value, or all equal): the interval is the mean itself."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    mean = float(x.mean())
    if np.ptp(x) == 0:  # scipy needs two values, and resampling a constant gives the constant
        return Interval(mean, mean, mean)
    from scipy import stats  # ~1 s to import: only when an interval is asked for

    ci = stats.bootstrap((x,), np.mean, n_resamples=n_boot, confidence_level=level, method="percentile",
                         vectorized=True, rng=np.random.default_rng(seed)).confidence_interval
    return Interval(mean, float(ci.low), float(ci.high))


def ratio_ci(numerators: Sequence[float], denominators: Sequence[float], n_boot: int = 2000,
             level: float = 0.95, seed: int = 0) -> Interval:
    """A micro average, sum(numerators) / sum(denominators) over units (questions), with a
    percentile bootstrap interval that resamples the units (pairs kept together). No positive
    denominator: NaN throughout; resamples whose denominators sum to 0 are left out."""
    num, den = np.asarray(numerators, float), np.asarray(denominators, float)
    if num.shape != den.shape:
        raise ValueError("numerators and denominators must have equal length")
    if den.sum() <= 0:
        return Interval(float("nan"), float("nan"), float("nan"))
    ratio = float(num.sum() / den.sum())
    idx = np.random.default_rng(seed).integers(0, num.size, size=(n_boot, num.size))
    d = den[idx].sum(axis=1)
    r = num[idx].sum(axis=1)[d > 0] / d[d > 0]
    tail = (1 - level) / 2 * 100
    return Interval(ratio, float(np.percentile(r, tail)), float(np.percentile(r, 100 - tail)))


def paired_difference_ci(a: Sequence[float], b: Sequence[float], **kw) -> Interval:
    """Mean of a - b over the same questions, with a bootstrap interval."""
    if len(a) != len(b):
        raise ValueError("paired samples must have equal length")
    return bootstrap_ci(np.asarray(a, float) - np.asarray(b, float), **kw)
