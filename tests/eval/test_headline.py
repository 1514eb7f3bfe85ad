"""The headline answer recall: an answer in a kept item's title counts as kept, one in a left-out
item's title as lost, and every question the whole items answer counts."""

from canopy_ray.compressor import chosen
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import Question, parse_item
from canopy_ray.core.metrics import kept_answer
from canopy_ray.eval.runs import question_record, whole_text
from canopy_ray.pipeline import Answer

NAMED = parse_item({"id": "n", "modality": "text", "title": "Lake Varne",
                    "sentences": ["It is a glacial lake.", " Its shore is rocky."]})
OTHER = parse_item({"id": "o", "modality": "text", "title": "Fjell Park",
                    "sentences": ["The park borders a lake.", " Lake Varne lies north of it."]})
QUESTION = Question("q", "Which lake lies north of Fjell Park?", ("Lake Varne",), candidates=("n", "o"))


def _record(kept: dict) -> dict:
    """The record of an answer whose compression kept ``kept[item_id]`` spans of each item."""
    results = [chosen(build_tree(it), {}, kept[it.id]) for it in (NAMED, OTHER)]
    ans = Answer(QUESTION.question, "", [r.evidence for r in results if r.kept], 1, [QUESTION.question], [],
                 results=results)
    items = (NAMED, OTHER)
    return question_record(QUESTION, ans, reader=False, heads=[], whole=[whole_text(it) for it in items])


def test_an_answer_in_a_left_out_items_title_is_lost():
    rec = _record({"n": [], "o": [(0, 1)]})  # Lake Varne's item left out, its title with it
    assert rec["answer_kept"] == 0.0


def test_an_answer_in_a_kept_items_title_is_kept():
    rec = _record({"n": [(0, 1)], "o": []})  # only the title names the answer
    assert rec["answer_kept"] == 1.0
    assert rec["answer_recall_informative"] is None  # the titles-aside figure leaves the question out


def test_every_question_the_whole_items_answer_counts():
    assert kept_answer(["Lake Varne"], "", [whole_text(OTHER)]) == 0.0  # found in a body: counted
    assert kept_answer(["Mount Kell"], "", [whole_text(NAMED), whole_text(OTHER)]) is None  # no item holds it
    assert kept_answer(["yes"], "yes", ["yes"]) is None  # yes/no is found in almost no text
