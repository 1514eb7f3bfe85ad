import json

import pytest

from canopy_ray.data.convert import (ConvertError, Value, convert, main, numbers_in, parse_number,
                                     read_records)
from tests.data._support import FIXTURES


def test_main_writes_files_and_prints_counts(tmp_path, capsys):
    out = tmp_path / "hp"
    assert main(["--format", "hotpotqa", str(FIXTURES / "hotpotqa_hf.jsonl"), str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 questions, 4 items" in printed and "unlocated: sent_id_out_of_range = 1" in printed
    assert "skipped: bad_json = 1" in printed
    assert len((out / "corpus.jsonl").read_text().splitlines()) == 4
    assert len((out / "questions.jsonl").read_text().splitlines()) == 2
    assert json.loads((out / "report.json").read_text())["gold_located"] == 4


def test_main_reports_a_missing_file(tmp_path, capsys):
    assert main(["--format", "tatqa", str(tmp_path / "nope.json"), str(tmp_path / "o")]) == 2
    assert "not found" in capsys.readouterr().err


def test_unknown_format_and_unreadable_json(tmp_path):
    with pytest.raises(ConvertError):
        convert("squad", FIXTURES / "tatqa.json", tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("[{]")
    with pytest.raises(ConvertError):
        list(read_records(bad))


def test_conversion_is_byte_for_byte_deterministic(tmp_path):
    for run in ("a", "b"):
        convert("nq", FIXTURES / "nq_open.jsonl", tmp_path / run, seed=3, n_distractors=2)
    for name in ("corpus.jsonl", "questions.jsonl", "report.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_number_normalisation():
    assert parse_number("$ (9,688)") == 9688 and parse_number("(9.4%)") == 9.4
    assert parse_number("2 0 1 8") == 2018 and parse_number("—") is None and parse_number("N/A") is None
    assert numbers_in("2019,2018 and $ (1,036.9)") == {2019, 2018, 1036.9}
    assert Value.of(-12.6).number == 12.6 and Value.of(5.0).text == "5"
    assert Value.of("the") is None and Value.of(True) is None
    assert Value.of("$1,496.5").in_text("Total $1,496.5 million")
    assert Value.of("LWAY").in_text("under the symbol \u201cLWAY.\u201d")
