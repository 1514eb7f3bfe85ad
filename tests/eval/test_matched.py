"""Matched-budget baselines: every item within one leaf of CANOPY's tokens for it and as close
as one leaf can get, random leaves seeded per (seed, question, item), flat_matched in f_theta
order; random_total within one leaf of the question's tokens, items drawn too."""

import numpy as np
import pytest

from canopy_ray.compressor import CompressOptions, Compressor
from canopy_ray.core.evidence import count_words, render
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import TableItem, TextItem
from canopy_ray.eval.matched import (fill_budget, fill_total, item_seed, leaves, matched_results, random_order,
                                     score_order)

SENTENCES = ["Tulsa lies on the Arkansas River.", "It is the second largest city in Oklahoma.",
             "The river rises in Colorado and flows east for nearly one and a half thousand miles.",
             "Oil made the town rich.", "Its art deco buildings date from the 1920s and 1930s.",
             "A short one.", "The Gathering Place park opened in 2018 on the river bank.", "Jazz too."]


def _tree(b=2):
    return build_tree(TextItem("t", "Tulsa", tuple(SENTENCES)), branching=b)


def _check_filled(tree, kept, budget, count=count_words):
    """As close to the budget as one leaf can get: a part within the budget that no other leaf
    fits beside (all of ``kept``, or all but one leaf), plus at most that one leaf, which
    brings the count closer to the budget; and no leaf more would bring it closer."""
    got = count(render(tree, kept))
    biggest = max(count(render(tree, [s])) for s in leaves(tree))
    assert got < budget + biggest
    for leaf in set(leaves(tree)) - set(kept):
        assert abs(count(render(tree, sorted(kept + [leaf]))) - budget) >= abs(got - budget), leaf

    def maximal(part):
        return count(render(tree, part)) <= budget and all(
            count(render(tree, sorted(part + [leaf]))) > budget for leaf in set(leaves(tree)) - set(part))

    if got <= budget:
        assert maximal(kept)
    else:  # one leaf over the budget, added to a maximal part because it got closer
        assert any(maximal([s for s in kept if s != k]) and
                   got - budget < budget - count(render(tree, [s for s in kept if s != k])) for k in kept)


@pytest.mark.parametrize("b", [2, 3])
def test_fill_budget_stays_within_and_fills_the_budget(b):
    tree = _tree(b)
    whole = count_words(render(tree, [tree.root.span]))
    title = count_words(render(tree, []))  # the least a piece shows; CANOPY's pieces are never shorter
    for budget in range(title, whole + 5, 3):
        for order in (random_order(tree, 1), random_order(tree, 2), list(reversed(leaves(tree)))):
            _check_filled(tree, fill_budget(tree, order, budget, count_words), budget)
    assert fill_budget(tree, leaves(tree), whole, count_words) == leaves(tree)  # the whole item fits


def test_random_order_is_seeded_per_question_and_item():
    tree = _tree()
    a = random_order(tree, item_seed(0, "q1", "t"))
    assert a == random_order(tree, item_seed(0, "q1", "t"))
    assert sorted(a) == leaves(tree)
    others = {tuple(random_order(tree, item_seed(s, q, "t"))) for s in (0, 1) for q in ("q1", "q2", "q3")}
    assert len(others) > 1  # 8! orders: seeds and questions draw different ones


def test_flat_order_takes_the_best_scoring_leaves_that_fit():
    tree = _tree()
    scores = {s: float(i % 3) + i / 100 for i, s in enumerate(leaves(tree))}
    order = score_order(tree, scores)
    assert [scores[s] for s in order] == sorted(scores.values(), reverse=True)
    best = order[0]
    budget = count_words(render(tree, [best])) + 4
    kept = fill_budget(tree, order, budget, count_words)
    assert best in kept
    _check_filled(tree, kept, budget)


def test_matched_results_meet_each_items_own_budget(minilm):
    comp = Compressor(minilm)
    items = [TextItem("t", "Tulsa", tuple(SENTENCES)),
             TableItem("s", "Sales", ("year", "units"), tuple((str(2000 + i), str(i * 7)) for i in range(9)))]
    q = minilm.encode_queries(["When did the park open?"])[0]
    budgets = {"t": 30, "s": 14}
    for kind in ("random", "flat"):
        results = matched_results(kind, comp, q, items, CompressOptions(branching=2), budgets, 0, "q")
        for r in results:
            assert r.tokens_after == count_words(r.evidence.text)
            _check_filled(r.tree, list(r.kept), budgets[r.id])
        if kind == "flat":  # every leaf was scored by f_theta, and the best one fits and is kept
            t = next(r for r in results if r.id == "t")
            assert set(t.scores) >= set(leaves(t.tree)) and max(t.scores, key=t.scores.get) in t.kept
    # an item CANOPY kept whole (an aggregation table) has the whole item as budget and stays whole
    whole = CompressOptions(whole=frozenset({"s"}))
    full = count_words(render(build_tree(items[1], whole=True), [(0, 9)]))
    (r,) = matched_results("random", comp, q, items[1:], whole, {"s": full}, 0, "q")
    assert r.kept == [(0, 9)] and r.tokens_after == full
    with pytest.raises(ValueError):
        matched_results("bogus", comp, q, items, whole, budgets, 0, "q")


def _total(trees, kept, count=count_words):
    return sum(count(render(t, k)) if k else 0 for t, k in zip(trees, kept))


def test_fill_total_fills_the_budget_of_all_items_together():
    trees = [_tree(), build_tree(TextItem("u", "Oil", tuple(SENTENCES[3:])), branching=2)]
    pool = [(i, leaf) for i, t in enumerate(trees) for leaf in leaves(t)]
    for budget in range(0, _total(trees, [leaves(t) for t in trees]) + 5, 4):
        for seed in (1, 2):
            order = [pool[j] for j in np.random.default_rng(seed).permutation(len(pool))]
            kept = fill_total(trees, order, budget, count_words)
            got = _total(trees, kept)
            unkept = [(i, leaf) for i, leaf in pool if leaf not in kept[i]]

            def added(i, leaf, part):
                return _total(trees, [sorted(k + [leaf]) if j == i else k for j, k in enumerate(part)])

            for i, leaf in unkept:  # no leaf more brings the count closer to the budget
                assert abs(added(i, leaf, kept) - budget) >= abs(got - budget)
            if got <= budget:  # and none fits beside the kept ones
                assert all(added(i, leaf, kept) > budget for i, leaf in unkept)
            else:  # one leaf over the budget, added to a part that fitted
                assert any(_total(trees, part) <= budget and got - budget < budget - _total(trees, part)
                           for i, k in enumerate(kept) for leaf in k
                           for part in [[[s for s in kk if s != leaf] if j == i else kk for j, kk in enumerate(kept)]])


def test_random_total_draws_leaves_of_any_item_within_the_questions_budget(minilm):
    comp = Compressor(minilm)
    items = [TextItem("t", "Tulsa", tuple(SENTENCES)), TextItem("u", "Oil", tuple(SENTENCES[3:]))]
    q = minilm.encode_queries(["When did the park open?"])[0]
    budgets = {"t": 30, "u": 0}  # CANOPY left "u" out

    def run(question_id, round=1):
        return matched_results("random_total", comp, q, items, CompressOptions(branching=2, round=round),
                               budgets, 0, question_id)

    leaf = max(count_words(render(r.tree, [s])) for r in run("q0") for s in leaves(r.tree))
    per_item = []
    for n in range(8):
        results = run(f"q{n}")
        assert abs(sum(r.tokens_after for r in results) - 30) < leaf
        per_item.append(tuple(r.tokens_after for r in results))
    assert any(u > 0 for _, u in per_item)  # leaves drawn from the item CANOPY left out
    assert len(set(per_item)) > 1  # seeded per question
    assert [r.kept for r in run("q0")] == [r.kept for r in run("q0")]
    assert any([r.kept for r in run(f"q{n}")] != [r.kept for r in run(f"q{n}", round=2)] for n in range(8))
