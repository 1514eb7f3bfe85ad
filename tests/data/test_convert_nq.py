import gzip
import json

from canopy_ray.data.convert import convert_records
from canopy_ray.data.nq import draw_candidates, passage_id
from canopy_ray.data.records import read_records
from tests.data._support import FIXTURES, assert_canonical

DAM = ("The Alpha River Dam is a concrete dam in the north. It was designed by the engineer "
       "Joan Smith in 1950. The reservoir supplies water to three towns.")


def _run(**kw):
    return convert_records("nq", read_records(FIXTURES / "nq_open.jsonl"), **kw)


def test_gold_passages_become_split_deduplicated_items():
    items, questions, report = _run(n_distractors=2)
    assert [i["title"] for i in items] == ["Alpha River Dam", "Beta Town", "Gamma Hill", "Zeta Lighthouse"]
    assert items[0] == {"id": passage_id("Alpha River Dam", DAM), "modality": "text", "title": "Alpha River Dam",
                        "sentences": ["The Alpha River Dam is a concrete dam in the north.",
                                      "It was designed by the engineer Joan Smith in 1950.",
                                      "The reservoir supplies water to three towns."]}
    assert items[0]["id"].startswith("nq:alpha-river-dam:")
    assert report.items == 4 and report.duplicate_items == 1
    assert_canonical(items, questions)


def test_gold_leaves_are_the_sentences_holding_an_answer():
    items, questions, report = _run(n_distractors=2)
    ids = {i["title"]: i["id"] for i in items}
    assert [q["id"] for q in questions] == ["nq:0", "nq:1", "nq:2", "nq:3", "nq:4"]
    assert [q["gold"] for q in questions] == [
        [{"item_id": ids["Alpha River Dam"], "leaves": [1]}],
        [{"item_id": ids["Alpha River Dam"], "leaves": [1]}],
        [{"item_id": ids["Beta Town"], "leaves": [0]}],
        [{"item_id": ids["Gamma Hill"], "leaves": []}],  # "purple" is nowhere: whole passage
        [{"item_id": ids["Zeta Lighthouse"], "leaves": [1]}],  # "Zeta" in "Zeta’s"
    ]
    assert questions[1]["answers"] == ["1950", "in 1950"]
    assert (report.gold_located, report.gold_unlocated) == (4, 1)
    assert report.unlocated == {"answer_not_in_passage": 1}
    assert report.skipped == {"no_gold_passage": 1, "bad_answers": 1}


def test_candidates_are_gold_plus_distinct_distractors_drawn_deterministically():
    _, questions, report = _run(n_distractors=2)
    for q in questions:
        gold = q["gold"][0]["item_id"]
        assert len(q["candidates"]) == 3 and len(set(q["candidates"])) == 3 and gold in q["candidates"]
    again = _run(n_distractors=2)[1]
    assert again == questions
    other_seeds = [[q["candidates"] for q in _run(n_distractors=2, seed=s)[1]] for s in (1, 2, 3)]
    assert any(c != [q["candidates"] for q in questions] for c in other_seeds)
    assert not report.notes


def test_the_draw_of_one_question_does_not_depend_on_the_others():
    pool = [f"p{i}" for i in range(50)]
    first = draw_candidates("p3", pool, "nq:7", seed=0, n=9)
    assert first == draw_candidates("p3", pool, "nq:7", seed=0, n=9)
    assert first != draw_candidates("p3", pool, "nq:8", seed=0, n=9)
    assert len(set(first)) == 10 and "p3" in first


def test_a_short_pool_gives_every_other_passage_and_a_note():
    items, questions, report = _run()  # 9 asked, 3 other passages exist
    assert all(sorted(q["candidates"]) == sorted(i["id"] for i in items) for q in questions)
    assert report.notes == {"fewer_distractors_than_asked": 5}


def test_gzip_input_and_written_files(tmp_path):
    from canopy_ray.data.convert import convert

    raw = tmp_path / "nq.jsonl.gz"
    with gzip.open(raw, "wt", encoding="utf-8") as f:
        f.write((FIXTURES / "nq_open.jsonl").read_text(encoding="utf-8"))
    report = convert("nq", raw, tmp_path / "out", n_distractors=2)
    items, questions, _ = _run(n_distractors=2)
    read = lambda name: [json.loads(l) for l in (tmp_path / "out" / name).read_text().splitlines()]
    assert read("corpus.jsonl") == items and read("questions.jsonl") == questions
    assert json.loads((tmp_path / "out" / "report.json").read_text()) == report.to_dict()


def _hard(pool_texts, question, n, dense=None):
    import random

    from canopy_ray.core.lexical import Bm25
    from canopy_ray.data.nq import hard_candidates

    pool = list(pool_texts)
    return hard_candidates("gold", question, pool, pool_texts, n=n, bm25=Bm25([pool_texts[p] for p in pool]),
                           dense=dense, rng=random.Random(0))


POOL = {"gold": "Alpha River Dam. It was designed by Joan Smith.",
        "dam": "Beta Dam. A concrete dam on the Beta river, designed in 1960.",
        "answer": "Joan Smith. An engineer who designed the Alpha River Dam.",  # holds the answer
        "river": "Alpha River. A river in the north with a dam.",
        "town": "Gamma Town. A small town with a harbour.",
        "hill": "Delta Hill. Sheep graze on its slopes."}
Q = {"question": "who designed the alpha river dam", "answers": ["Joan Smith"]}


def test_hard_distractors_are_the_nearest_passages_without_an_answer():
    got = _hard(POOL, Q, 2)
    assert sorted(got) == ["dam", "gold", "river"]  # the two sharing most words; "answer" holds Joan Smith
    # a dense ranking takes turns with BM25: its nearest passage without the answer (town, which shares
    # no word with the question) comes in beside BM25's first (river)
    dense = __import__("numpy").array([1.0, 0.0, 0.9, 0.1, 0.8, 0.0])  # pool order: gold dam answer river town hill
    assert sorted(_hard(POOL, Q, 2, dense)) == ["gold", "river", "town"]
    assert len(_hard(POOL, Q, 9)) == 5  # all the pool holds, less the answer's passage


def test_hard_distractors_come_from_the_gold_split_and_are_deterministic():
    from canopy_ray.data.nq import passage_split

    items, questions, report = _run(n_distractors=2, distractors="hard")
    split = {i["id"]: passage_split(i["id"]) for i in items}
    for q in questions:
        gold = q["gold"][0]["item_id"]
        assert gold in q["candidates"] and all(split[c] == split[gold] for c in q["candidates"])
    assert _run(n_distractors=2, distractors="hard")[1] == questions
    assert_canonical(items, questions)
