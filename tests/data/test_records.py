"""The helpers every converter shares (canopy_ray.data.records)."""

import pytest

from canopy_ray.data.records import ConvertError, Value, locate_sentences, numbers_in, parse_number, read_records


def test_unreadable_json(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[{]")
    with pytest.raises(ConvertError):
        list(read_records(bad))


def test_number_normalisation():
    assert parse_number("$ (9,688)") == 9688 and parse_number("(9.4%)") == 9.4
    assert parse_number("2 0 1 8") == 2018 and parse_number("—") is None and parse_number("N/A") is None
    assert numbers_in("2019,2018 and $ (1,036.9)") == {2019, 2018, 1036.9}
    assert Value.of(-12.6).number == 12.6 and Value.of(5.0).text == "5"
    assert Value.of("the") is None and Value.of(True) is None
    assert Value.of("$1,496.5").in_text("Total $1,496.5 million")
    assert Value.of("LWAY").in_text("under the symbol \u201cLWAY.\u201d")


@pytest.mark.parametrize("sentences, answer, leaves", [
    (["He was born in St.", "Ives in 1901."], "St. Ives", [0, 1]),  # cut by the splitter
    (["A b.", "C d.", "E f."], "d. E", [1, 2]),
    (["The 10th item.", "Item 1."], "1", [1]),  # whole tokens: "10th" does not hold "1"
    (["Nothing here."], "absent", []),
])
def test_locate_sentences(sentences, answer, leaves):
    assert locate_sentences(sentences, [Value.of(answer)]) == leaves
