import math

import numpy as np
import pytest

from canopy_ray import balanced_tree
from canopy_ray.core.evidence import evidence_body, head, piece, render_evidence
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import TableItem, TextItem
from canopy_ray.core.metrics import (accuracy, answer_found, answer_recall, bootstrap_ci, decision_accuracy,
                                     exact_match, f1_score, gold_recall, informative, is_short, normalize_answer,
                                     paired_difference_ci, ratio_ci, pruned_share, refinement_stats)


@pytest.mark.parametrize("raw,norm", [("The Eiffel Tower!", "eiffel tower"), ("  a  Cat, an owl ", "cat owl"),
                                      ("Tulsa, Oklahoma.", "tulsa oklahoma"), ("theatre", "theatre")])
def test_squad_normalisation(raw, norm):
    assert normalize_answer(raw) == norm


def test_exact_match_takes_the_best_gold():
    assert exact_match("the Tulsa", ["Oklahoma", "Tulsa"]) == 1.0
    assert exact_match("Tulsa OK", ["Tulsa"]) == 0.0


def test_f1_by_hand():
    # pred tokens: tulsa oklahoma usa; gold: tulsa oklahoma -> P = 2/3, R = 1, F1 = 0.8
    assert f1_score("Tulsa, Oklahoma, USA", ["Tulsa Oklahoma"]) == pytest.approx(0.8)
    assert f1_score("nothing", ["Tulsa"]) == 0.0
    assert f1_score("x", []) == 0.0
    assert f1_score("the", ["a"]) == 1.0  # both normalise to empty


def test_accuracy_and_answer_recall():
    assert accuracy("(B) ", "b") == 1.0
    assert answer_recall("It first played in Tulsa, Oklahoma.", ["tulsa"]) == 1.0
    assert answer_recall("Tulsans", ["tulsa"]) == 0.0


# ---------------------------------------------------------------- body answer recall

BAND = TextItem("band", "Tinted Windows (band)", ("The group formed in New York City in 2008.",
                                                  " Its first performance was in Tulsa, Oklahoma."))
SALES = TableItem("sales", "Sales by type", ("Type", "2019", "2018"),
                  (("Fixed", "1,452", "1,146"), ("Other", "4", "56"), ("Staff", "14", "12")))
PIECES = [piece(build_tree(BAND), [(0, 2)]), piece(build_tree(SALES), [(0, 3)])]
BODY, TEXT = evidence_body(PIECES), render_evidence(PIECES)
HEADS = [head(BAND), head(SALES)]


@pytest.mark.parametrize("answers", [["Tinted Windows"], ["Sales"], ["2019"], ["Type"]])
def test_an_answer_only_in_a_title_or_header_row_is_not_in_the_body(answers):
    assert answer_recall(TEXT, answers) == 1.0  # the reader sees it
    assert answer_recall(BODY, answers) == 0.0  # but no method chose it
    assert not informative(answers, HEADS)


def test_an_answer_in_the_rows_or_sentences_is_in_the_body():
    for answers in (["Tulsa"], ["New York City"], ["1,452"], ["Staff"]):
        assert answer_recall(BODY, answers) == 1.0 and informative(answers, HEADS), answers


def test_informative_is_an_answer_none_yes_no_none_in_a_shown_head():
    assert informative(["Tulsa"], HEADS)
    assert not informative([], HEADS) and not informative(["the"], HEADS)  # no answer left once normalised
    assert not informative(["Yes"], HEADS) and not informative(["Tulsa", "no"], HEADS)
    assert not informative(["Tulsa", "2018"], HEADS)  # one gold answer in a header row is enough
    assert informative(["2018"], [head(BAND)])  # only the heads of the items shown count
    assert not informative(["Tinted Windows"], ["Tinted Windows (album): "])  # a title of any shown item


@pytest.mark.parametrize("answer,short", [("4", True), ("-7", True), ("3%", True), ("0.4", True), ("(1.6)", True),
                                          ("U.S.", True), ("14", True), ("-2.5", True), ("2019", False), ("-12.5", False),
                                          ("the", False), ("Tulsa", False)])
def test_short_answers_are_one_or_two_characters_once_normalised(answer, short):
    assert is_short(answer) is short


@pytest.mark.parametrize("answer,evidence", [("4", "Other | 4 | 56"), ("4", "(4)"), ("4", "$4,"), ("4", "4%"),
                                             ("4", "4.0 million"), ("-7", "Change | (7)"), ("0.4", "rose by 0.40%"),
                                             ("3%", "a 3% rise"), ("U.S.", "sold in the U.S. and Canada"),
                                             ("14", "Staff | 14 | 12")])
def test_a_short_answer_is_found_as_a_whole_number_or_cell(answer, evidence):
    assert answer_found(evidence, answer)


@pytest.mark.parametrize("answer,evidence", [("4", "in fiscal 2014"), ("4", "Other | 40 | 56"), ("4", "4.5"),
                                             ("4", "1.4"), ("4", "Q4 sales"), ("4", "4-year term"), ("4", ".4"),
                                             ("-1.4", "Staff | 14 | 12"), ("0.4", "04"), ("U.S.", "tell us")])
def test_a_short_answer_is_not_found_inside_another_token(answer, evidence):
    assert not answer_found(evidence, answer)


def test_the_short_rule_reads_cells_of_the_body():
    assert answer_recall(BODY, ["4"]) == 1.0  # the "Other" cell
    assert answer_recall(BODY, ["-1.4"]) == 0.0  # SQuAD normalisation would have read "14" in the Staff row
    assert answer_recall(BODY, ["1"]) == 0.0  # inside "1,452", "1,146", "14", "12": never a token


def test_several_gold_answers_are_found_when_any_one_is():
    # a multi-span answer (TAT-QA) is stored like alternatives (NQ): one found span counts
    assert answer_recall(BODY, ["Fixed", "Lease"]) == 1.0
    assert answer_recall(BODY, ["Lease", "Rent"]) == 0.0
    assert answer_recall(BODY, ["Staff", "4"]) == 1.0 and answer_recall(BODY, []) == 0.0


def test_refinement_stats_by_hand():
    root = balanced_tree(4)  # gold {0, 1}
    scores = {(0, 4): 0.3, (0, 2): 0.5, (2, 4): 0.1, (0, 1): 0.6, (1, 2): 0.2}
    s = refinement_stats(root, scores, kept=[(0, 1)], gold_leaves={0, 1})
    # root correct; (0, 2) is fully gold but child (0, 1) beats it -> wrong
    assert (s.pref_nodes, s.pref_correct, s.gold_leaves, s.gold_kept, s.leaves, s.leaves_kept) == (2, 1, 2, 1, 4, 1)
    t = refinement_stats(balanced_tree(2), {(0, 2): 1, (0, 1): 0, (1, 2): 0}, [(0, 2)], {1})
    stats = [s, t]
    assert decision_accuracy(stats) == pytest.approx(1 / 3)
    assert gold_recall(stats) == pytest.approx(2 / 3)
    assert pruned_share(stats) == 0.5
    assert math.isnan(decision_accuracy([]))


def test_bootstrap_interval_of_a_known_sample():
    x = np.r_[np.zeros(50), np.ones(50)]
    ci = bootstrap_ci(x, n_boot=4000, seed=1)
    assert ci.mean == 0.5
    # the normal approximation: 0.5 +- 1.96 * sqrt(0.25 / 100) = +-0.098
    assert ci.low == pytest.approx(0.402, abs=0.02) and ci.high == pytest.approx(0.598, abs=0.02)
    assert bootstrap_ci([3.0, 3.0]).low == 3.0


def test_bootstrap_is_scipys_percentile_interval():
    from scipy import stats

    x = np.random.default_rng(3).random(40)
    ref = stats.bootstrap((x,), np.mean, n_resamples=500, confidence_level=0.9, method="percentile",
                          rng=np.random.default_rng(7)).confidence_interval
    ci = bootstrap_ci(x, n_boot=500, level=0.9, seed=7)
    assert (ci.low, ci.high) == pytest.approx((ref.low, ref.high))
    assert bootstrap_ci(x, seed=1) == bootstrap_ci(x, seed=1)  # seeded: the same interval every time
    assert bootstrap_ci([0.7]) == bootstrap_ci([0.7, 0.7]) and bootstrap_ci([0.7]).high == 0.7  # no spread
    assert math.isnan(bootstrap_ci([]).mean)


def test_paired_difference_is_a_minus_b_question_by_question():
    # a - b = [1, 0, 0, 1]: mean 0.5; a resample of 4 is all zeros (or all ones) with
    # probability 1/16 > 2.5%, so the 95% interval is [0, 1]
    assert paired_difference_ci([1, 0, 1, 1], [0, 0, 1, 0]).as_dict() == {"mean": 0.5, "low": 0.0, "high": 1.0}
    assert paired_difference_ci([0, 0, 1, 0], [1, 0, 1, 1]).as_dict() == {"mean": -0.5, "low": -1.0, "high": 0.0}
    # paired, not two samples: each question is 0.5 ahead, so there is no spread at all
    same = paired_difference_ci([1.0, 2.0, 3.0, 4.0], [0.5, 1.5, 2.5, 3.5])
    assert same.as_dict() == {"mean": 0.5, "low": 0.5, "high": 0.5}
    with pytest.raises(ValueError):
        paired_difference_ci([1.0], [1.0, 2.0])


def test_ratio_ci_is_the_micro_average_with_questions_resampled():
    num, den = [1, 3, 0, 2], [2, 3, 0, 4]
    iv = ratio_ci(num, den, seed=1)
    assert iv.mean == pytest.approx(6 / 9)  # sum over sum, not the mean of 1/2, 1, 1/2
    assert iv.low < iv.mean < iv.high and 0 <= iv.low and iv.high <= 1
    same = ratio_ci([2, 4, 6], [4, 8, 12])  # every unit at 1/2: no spread
    assert same.low == same.mean == same.high == pytest.approx(0.5)
    assert math.isnan(ratio_ci([0, 0], [0, 0]).mean)
    with pytest.raises(ValueError):
        ratio_ci([1], [1, 2])
