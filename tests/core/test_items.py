import pytest

from canopy_ray.core.errors import ItemError
from canopy_ray.core.items import (TableItem, TextItem, VideoItem, item_to_dict, iter_jsonl,
                                   parse_item, parse_question, question_to_dict)


def test_text_is_split_into_sentences_with_a_real_splitter():
    item = parse_item({"id": "a", "modality": "text", "title": "T",
                       "text": "Dr. Smith paid $3.50 in the U.S. on Monday. He left. Did he?"})
    assert item.sentences == ("Dr. Smith paid $3.50 in the U.S. on Monday.", "He left.", "Did he?")


def test_given_sentences_are_kept_as_given():
    item = parse_item({"id": "a", "modality": "text", "sentences": ["One. Two.", " three"]})
    assert isinstance(item, TextItem) and item.sentences == ("One. Two.", " three")


def test_all_modalities_round_trip_through_the_canonical_form():
    objs = [
        {"id": "t", "modality": "text", "title": "T", "sentences": ["a.", "b."]},
        {"id": "tb", "modality": "table", "title": "Tb", "header": ["x", "y"], "rows": [["1", "2"]]},
        {"id": "i", "modality": "image", "title": "I", "path": "a.png", "caption": "cat"},
        {"id": "v", "modality": "video", "title": "V", "path": "v.mp4", "duration_s": 61.0,
         "transcript": [{"start": 0.0, "end": 4.0, "text": "hi"}]},
    ]
    for obj in objs:
        assert item_to_dict(parse_item(obj)) == obj


def test_numeric_table_cells_become_strings():
    item = parse_item({"id": "tb", "modality": "table", "header": ["x"], "rows": [[1], [2.5]]})
    assert isinstance(item, TableItem) and item.rows == (("1",), ("2.5",))


@pytest.mark.parametrize("obj,reason", [
    ([], "not_an_object"),
    ({"modality": "text", "text": "x"}, "missing_id"),
    ({"id": "", "modality": "text", "text": "x"}, "missing_id"),
    ({"id": "a", "modality": "audio"}, "bad_modality"),
    ({"id": "a", "modality": "text", "text": "   "}, "empty_text"),
    ({"id": "a", "modality": "text"}, "missing_field"),
    ({"id": "a", "modality": "text", "sentences": ["", " "]}, "empty_text"),
    ({"id": "a", "modality": "text", "sentences": "x"}, "bad_field"),
    ({"id": "a", "modality": "table", "header": ["x", "y"], "rows": [["1", "2"], ["3"]]}, "ragged_table"),
    ({"id": "a", "modality": "table", "header": ["x"], "rows": []}, "empty_table"),
    ({"id": "a", "modality": "table", "header": [], "rows": [[]]}, "bad_table"),
    ({"id": "a", "modality": "table", "header": ["x"], "rows": [[{"a": 1}]]}, "bad_table"),
    ({"id": "a", "modality": "image"}, "missing_field"),
    ({"id": "a", "modality": "video", "path": "v.mp4", "duration_s": 0}, "bad_video"),
    ({"id": "a", "modality": "video", "path": "v.mp4", "duration_s": "long"}, "bad_field"),
    ({"id": "a", "modality": "video", "path": "v.mp4", "duration_s": 9,
      "transcript": [{"start": 5, "end": 2, "text": "x"}]}, "bad_video"),
])
def test_bad_items_raise_a_typed_error_with_a_reason(obj, reason):
    with pytest.raises(ItemError) as e:
        parse_item(obj)
    assert e.value.reason == reason


def test_jsonl_reader_yields_errors_instead_of_raising():
    lines = ['{"id": "a", "modality": "text", "text": "Hello."}', "{not json", "", '{"id": "b"}']
    out = list(iter_jsonl(lines))
    assert [n for n, _ in out] == [1, 2, 4]
    assert isinstance(out[0][1], TextItem)
    assert out[1][1].reason == "bad_json" and out[2][1].reason == "bad_modality"


def test_question_round_trip_and_whole_item_gold():
    obj = {"id": "q1", "question": "Who?", "answers": ["Ann"],
           "gold": [{"item_id": "a", "leaves": [2, 0]}, {"item_id": "b", "leaves": []}],
           "candidates": ["a", "b", "c"]}
    q = parse_question(obj)
    assert q.gold[0].leaves == (0, 2) and q.gold[1].leaves == ()
    assert question_to_dict(q)["gold"][0]["leaves"] == [0, 2]
    assert parse_question(question_to_dict(q)) == q


@pytest.mark.parametrize("obj", [{"id": "q", "question": " "}, {"question": "x"},
                                 {"id": "q", "question": "x", "gold": [{"item_id": "a", "leaves": [-1]}]}])
def test_bad_questions_raise(obj):
    with pytest.raises(ItemError):
        parse_question(obj)


def test_video_item_fields():
    item = parse_item({"id": "v", "modality": "video", "path": "v.mp4", "duration_s": 190})
    assert isinstance(item, VideoItem) and item.transcript == ()
