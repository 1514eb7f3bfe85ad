"""Shared paths and checks for the converter tests."""

from pathlib import Path

from canopy_ray.core.items import item_to_dict, parse_item, parse_question, question_to_dict

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"
# ../shared/data relative to the project root (CI has the same copy; a user's clone does not)
SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def assert_canonical(items: list[dict], questions: list[dict]) -> None:
    """Every item and question round-trips, and every reference names an item."""
    ids = [i["id"] for i in items]
    assert len(ids) == len(set(ids))
    for obj in items:
        assert item_to_dict(parse_item(obj)) == obj
    known = set(ids)
    for obj in questions:
        assert question_to_dict(parse_question(obj)) == obj
        assert {g["item_id"] for g in obj["gold"]} <= known
        assert set(obj["candidates"]) <= known
