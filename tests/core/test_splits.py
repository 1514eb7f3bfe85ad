"""Document-level splits, fixed samples and gold items: stable, file-order independent, pure."""

import hashlib

from canopy_ray.core.items import Gold, Question, TextItem
from canopy_ray.core.splits import assign_splits, gold_items, sample_questions, split_of_key


def _q(qid: str, *gold: str, candidates: tuple[str, ...] = ()) -> Question:
    return Question(qid, f"{qid}?", ("a",), gold=tuple(Gold(g, (0,)) for g in gold), candidates=candidates)


def never_shared(questions, splits) -> bool:
    """No gold or candidate item of a question occurs in a question of another split."""
    owner = {}
    for q in questions:
        for item in (*(g.item_id for g in q.gold), *q.candidates):
            if owner.setdefault(item, splits[q.id]) != splits[q.id]:
                return False
    return True


def test_split_is_by_document_and_shares_are_close_to_the_target():
    qs = [_q(f"q{k}", f"doc{k}") for k in range(3000)]
    splits = assign_splits(qs)
    names = list(splits.values())
    shares = {s: names.count(s) / len(names) for s in ("train", "validation", "test")}
    assert abs(shares["train"] - 0.70) < 0.03 and abs(shares["test"] - 0.15) < 0.03
    # the split is a hash of the document, not of the question id or the order
    renamed = assign_splits(reversed([_q(f"other{k}", f"doc{k}") for k in range(3000)]))
    assert [renamed[f"other{k}"] for k in range(3000)] == [splits[f"q{k}"] for k in range(3000)]
    h = int(hashlib.sha1(b"item:doc42").hexdigest()[:8], 16) / 0x100000000
    assert splits["q42"] == ("train" if h < 0.70 else "validation" if h < 0.85 else "test")


def test_questions_sharing_a_document_share_a_split():
    # a chain: q0 and q1 share doc1, q1 and q2 share doc2; q3 and q4 ask of two reports that
    # share paragraph p2 (neither's gold); 200 pairs sharing a gold paragraph
    qs = [_q("q0", "doc0", "doc1"), _q("q1", "doc1", "doc2"), _q("q2", "doc2", "doc3"),
          _q("q3", "t", candidates=("t", "p1", "p2")), _q("q4", "u", candidates=("u", "p2"))]
    qs += [_q(f"a{k}", f"g{k}", f"x{k}") for k in range(200)] + [_q(f"b{k}", f"y{k}", f"g{k}") for k in range(200)]
    splits = assign_splits(qs)
    assert splits["q0"] == splits["q1"] == splits["q2"] and splits["q3"] == splits["q4"]
    assert all(splits[f"a{k}"] == splits[f"b{k}"] for k in range(200))
    assert len(set(splits.values())) == 3 and never_shared(qs, splits)


def test_a_distractor_that_is_another_questions_gold_joins_the_two():
    # HotpotQA: a paragraph is one question's gold and, in another question's own context,
    # a distractor; 200 such pairs, each pair sharing only that paragraph
    qs = [_q(f"g{k}", f"p{k}", candidates=(f"p{k}", f"other{k}")) for k in range(200)]
    qs += [_q(f"d{k}", f"own{k}", candidates=(f"own{k}", f"p{k}")) for k in range(200)]
    splits = assign_splits(qs)
    assert all(splits[f"g{k}"] == splits[f"d{k}"] for k in range(200))
    assert len(set(splits.values())) == 3 and never_shared(qs, splits)


def test_distractors_drawn_from_the_golds_split_keep_each_questions_split():
    # NQ: distractors are other questions' gold passages of the same split (the converter
    # draws them so); they join groups, and each question keeps its gold's split
    golds = [f"g{k}" for k in range(300)]
    by_split = {s: [g for g in golds if split_of_key(f"item:{g}") == s] for s in ("train", "validation", "test")}
    qs = []
    for k, g in enumerate(golds):
        pool = by_split[split_of_key(f"item:{g}")]
        i = pool.index(g)
        qs.append(_q(f"n{k}", g, candidates=(g, pool[(i + 1) % len(pool)], pool[(i + 7) % len(pool)])))
    splits = assign_splits(qs)
    assert splits == {f"n{k}": split_of_key(f"item:{g}") for k, g in enumerate(golds)}
    assert len(set(splits.values())) == 3 and never_shared(qs, splits)


def test_sample_is_independent_of_order_and_nested():
    qs = [Question(f"q{i}", f"question {i}?", ("a",)) for i in range(30)]
    five = sample_questions(qs, 5, seed=1)
    assert sample_questions(list(reversed(qs)), 10, seed=1)[:5] == five
    assert sample_questions(qs, 5, seed=2) != five and len(sample_questions(qs)) == 30


def test_gold_items_keep_located_multi_leaf_gold_of_the_split():
    items = {"a": TextItem("a", "A", ("One.", "Two.", "Three.")), "b": TextItem("b", "B", ("Only.",))}
    qs = [Question("q1", "?", ("x",), gold=(Gold("a", (1, 7)), Gold("b", (0,)), Gold("a", ()))),
          Question("q2", "?", ("x",), gold=(Gold("zz", (0,)),))]
    got = list(gold_items("nq", items, qs))
    assert [(g.question.id, g.tree.item.id, g.gold) for g in got] == [("q1", "a", frozenset({1}))]
    split = assign_splits(qs)["q1"]
    assert list(gold_items("nq", items, qs, split=split)) == got
    other = next(s for s in ("train", "validation", "test") if s != split)
    assert list(gold_items("nq", items, qs, split=other)) == []
