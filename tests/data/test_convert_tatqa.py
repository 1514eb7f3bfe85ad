import pytest

from canopy_ray.data.convert import convert_records
from canopy_ray.data.tatqa import (derivation_values, header_row_count, is_header_row, merge_header,
                                   split_table)
from canopy_ray.data.records import read_records
from tests.data._support import FIXTURES, assert_canonical


@pytest.mark.parametrize("table, n", [
    ([["", "2019", "2018"], ["Sales", "$1,496.5", "$1,202.9"]], 1),
    ([["Plan", "Workforce", "Total"], ["Balance", "$10,045", "$11,414"]], 1),
    # spanning label, years, unit line
    ([["", "", "Years Ended September 30,", ""], ["", "2019", "2018", "2017"], ["", "", "(in millions)", ""],
      ["Fixed Price", "$ 1,452.4", "$ 1,146.2", "$ 1,036.9"]], 3),
    # a labelled row of years is a header; a section row ("Revenue:") is not
    ([["($ in millions)", "", ""], ["At December 31:", "2019", "2018"], ["Revenue:", "", ""],
      ["Recorded investment", "$22,446", "$31,182"]], 2),
    ([["", "2019", "", "2018", ""], ["", "Men", "Women", "Men", "Women"], ["Aged 65", "86.8", "88.9", "87.3", "89.3"]], 2),
    # a row with a figure is data even with an empty first cell
    ([["", "2019", "2018"], ["", "30", "22"], ["Total", "302", "148"]], 1),
    # at least one data row is left
    ([["", "2019"], ["", "2018"]], 1),
])
def test_header_row_count(table, n):
    assert header_row_count(table) == n


def test_is_header_row_details():
    assert is_header_row(["", "", "(in thousands)", ""])
    assert is_header_row(["", "U.S. $ in thousands", ""])
    assert is_header_row(["For the year ended:", "2019", "2 0 1 8"])
    assert not is_header_row(["Revenue:", "", "", ""])
    assert not is_header_row(["", "$30", "—"])
    assert not is_header_row(["Total", "2019", "Other"])


def test_merge_header_and_padding():
    header, rows = split_table([["", "", "Years Ended June 30,"], ["", "2019", "2018"],
                                ["Sales", "1"], ["Other", "2", "3"]])
    assert header == ["", "2019", "Years Ended June 30, 2018"]
    assert rows == [["Sales", "1", ""], ["Other", "2", "3"]]
    assert merge_header([["", "Year", "Year"], ["", "Year", "2019"]], 4) == ["", "Year", "Year 2019", ""]


def test_derivation_values():
    nums = lambda d, t="arithmetic": [v.number for v in derivation_values(d, t)]
    assert nums("44.1-56.7") == [44.1, 56.7]
    assert nums("(44.1-56.7)/56.7") == [44.1, 56.7, 56.7]
    assert nums("(150,416+ 90,102)/2") == [150416.0, 90102.0]  # the divisor is a constant
    assert nums("24.9 / 33.5 - 1") == [24.9, 33.5]
    assert nums("8,868/97,219 * 100") == [8868.0, 97219.0]
    texts = lambda d, t: [v.text for v in derivation_values(d, t)]
    assert texts("Fixed Price##Other", "count") == ["Fixed Price", "Other"]
    assert texts("Impairment charges", "count") == ["Impairment charges"]
    assert texts("locate and analyze Unvested RSUs in row 4", "multi-span") == ["Unvested RSUs"]
    assert derivation_values("Find the year with the higher EBITDA", "span") == []


def _run():
    return convert_records("tatqa", read_records(FIXTURES / "tatqa.json"))


def test_items():
    items, questions, report = _run()
    table = items[0]
    assert table["modality"] == "table" and table["id"].startswith("tatqa:table:")
    assert table["header"] == ["", "2019", "Years Ended June 30, 2018 (in thousands)", "2017"]
    assert table["rows"] == [["Product sales", "$ 1,200.5", "$ 1,100.0", "$ 950.0"], ["Services:", "", "", ""],
                             ["Consulting", "300", "(250)", "200"], ["Total revenue", "$1,500.5", "$1,350.0", "$1,150.0"]]
    assert items[1]["sentences"] == ["Revenue grew in fiscal 2019.", "Product sales rose because of the new Orion line."]
    assert items[3]["header"] == ["Region", "Stores", "Staff"] and len(items[3]["rows"]) == 2
    assert [i["modality"] for i in items] == ["table", "text", "text", "table", "text", "text"]
    assert report.items == 6
    assert_canonical(items, questions)


def test_gold_and_counts():
    items, questions, report = _run()
    table_a, p1, p2, table_b, _, pc = (i["id"] for i in items)
    gold = {q["id"]: q["gold"] for q in questions}
    assert gold == {
        "a1": [{"item_id": table_a, "leaves": [3]}],  # "$1,500.5" in Total revenue
        "a2": [{"item_id": table_a, "leaves": [2]}],  # operands 300 and 250 = "(250)"
        "a3": [{"item_id": table_a, "leaves": [0]}],  # "/2" is not an operand
        "a4": [{"item_id": p1, "leaves": [1]}],
        "a5": [{"item_id": table_a, "leaves": [3]}, {"item_id": p2, "leaves": []}],
        "a6": [{"item_id": table_a, "leaves": [0, 2]}],  # count: the rows it names
        "a7": [],  # rel paragraph "9" does not exist
        "b1": [{"item_id": table_b, "leaves": [0, 1]}],
        "b2": [{"item_id": table_b, "leaves": []}],
        "c1": [{"item_id": pc, "leaves": [0]}],  # the document's table was malformed
    }
    answers = {q["id"]: q["answers"] for q in questions}
    assert answers["a2"] == ["50"] and answers["a3"] == ["1150.25"] and answers["a6"] == ["2"]
    assert answers["b1"] == ["12", "9"]
    cands = {q["id"]: q["candidates"] for q in questions}
    assert cands["a1"] == [table_a, p1, p2] and cands["b2"] == [table_b, items[4]["id"]] and cands["c1"] == [pc]
    assert (report.questions, report.gold_located, report.gold_unlocated) == (10, 8, 2)
    assert report.unlocated == {"paragraph_value_not_found": 1, "rel_paragraph_missing": 1,
                                "table_value_not_found": 1}
    assert report.skipped == {"missing_id": 1, "table_malformed": 1}
    assert report.duplicate_items == 0
