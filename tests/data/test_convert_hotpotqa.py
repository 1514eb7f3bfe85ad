import json
import re

from canopy_ray.data.convert import convert_records
from canopy_ray.data.hotpotqa import paragraph_id
from canopy_ray.data.records import read_records
from tests.data._support import FIXTURES, assert_canonical

BETA = ["Beta Town is a small port on Lake Orin.", " It was founded in 1820 by fishermen."]


def _run(name):
    return convert_records("hotpotqa", read_records(FIXTURES / name))


def test_hf_layout_items_are_the_given_paragraphs_deduplicated():
    items, questions, report = _run("hotpotqa_hf.jsonl")
    assert [(i["title"], i["sentences"]) for i in items] == [
        ("Alpha River", ["The Alpha River is 40 km long.", " It flows into Lake Orin at Beta Town.",
                         " Trout live in it."]),
        ("Beta Town", BETA),  # kept as given, leading space included, once for both questions
        ("Gamma Hill", ["Gamma Hill is the highest point of the county.", " Sheep graze on its slopes."]),
        ("Delta Lake", ["Delta Lake is a reservoir near Gamma Hill.", " It was filled in 1961."]),
    ]
    assert all(i["modality"] == "text" for i in items)
    assert all(re.fullmatch(r"hotpotqa:[a-z0-9-]+:[0-9a-f]{10}", i["id"]) for i in items)
    assert items[1]["id"] == paragraph_id("Beta Town", BETA) and items[1]["id"].startswith("hotpotqa:beta-town:")
    assert report.items == 4 and report.duplicate_items == 1
    assert_canonical(items, questions)


def test_hf_layout_gold_candidates_and_counts():
    items, questions, report = _run("hotpotqa_hf.jsonl")
    alpha, beta, gamma, delta = (i["id"] for i in items)
    q1, q2 = questions
    assert q1 == {"id": "hq1", "question": "Which town lies at the mouth of the Alpha River?",
                  "answers": ["Beta Town"],
                  # Beta Town fact 5 is out of range: counted, the in-range fact 0 stays
                  "gold": [{"item_id": alpha, "leaves": [1]}, {"item_id": beta, "leaves": [0]}],
                  "candidates": [alpha, beta, gamma]}
    assert q2["gold"] == [{"item_id": beta, "leaves": [1]}, {"item_id": delta, "leaves": [0]}]
    assert q2["candidates"] == [beta, delta] and q2["answers"] == ["1820"]
    assert report.questions == 2
    assert (report.gold_located, report.gold_unlocated) == (4, 0)
    assert report.unlocated == {"sent_id_out_of_range": 1, "title_not_in_context": 1}
    assert report.skipped == {"bad_json": 1, "bad_context": 1}


def test_list_layout():
    items, questions, report = _run("hotpotqa_list.json")
    bridge, zeta, eta = (i["id"] for i in items)
    assert [i["title"] for i in items] == ["Epsilon Bridge", "Zeta Park", "Eta Tower"]
    assert questions == [
        {"id": "hl1", "question": "When did the park next to Epsilon Bridge open?", "answers": ["1901"],
         "gold": [{"item_id": bridge, "leaves": [2]}, {"item_id": zeta, "leaves": [0]}],
         "candidates": [bridge, zeta]},
        {"id": "hl2", "question": "Is Eta Tower taller than 100 m?", "answers": ["yes"],
         "gold": [{"item_id": eta, "leaves": [1]}], "candidates": [zeta, eta]},
    ]
    assert report.skipped == {"missing_id": 1} and report.duplicate_items == 1
    assert_canonical(items, questions)


def test_both_layouts_give_the_same_id_for_the_same_paragraph(tmp_path):
    hf = {"id": "x", "question": "q?", "answer": "a",
          "supporting_facts": {"title": ["Zeta Park"], "sent_id": [9]},
          "context": {"title": ["Zeta Park"], "sentences": [["Zeta Park opened in 1901.", " It has a rose garden."]]}}
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(hf) + "\n")
    items, questions, report = convert_records("hotpotqa", read_records(path))
    list_items, _, _ = _run("hotpotqa_list.json")
    assert items[0]["id"] == list_items[1]["id"]
    # the only fact is out of range: the paragraph is gold as a whole
    assert questions[0]["gold"] == [{"item_id": items[0]["id"], "leaves": []}]
    assert (report.gold_located, report.gold_unlocated) == (0, 1)
    assert report.unlocated == {"sent_id_out_of_range": 1}


def test_malformed_records_are_counted_not_raised():
    records = [42, {"id": "a"}, {"id": "b", "question": "q?", "context": [["T", "not a list"]]},
               {"id": "c", "question": "", "answer": "x", "context": [["T", ["s."]]]},
               {"id": "d", "question": "q?", "answer": "x", "context": [["T", ["", " "]]]}]
    items, questions, report = convert_records("hotpotqa", records)
    assert items == [] and questions == []
    assert report.skipped == {"not_an_object": 1, "bad_context": 2, "question_empty_question": 1,
                              "item_empty_text": 1}
