import json

import pytest

from canopy_ray.data.convert import convert, main
from canopy_ray.data.records import ConvertError
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


def test_unknown_format(tmp_path):
    with pytest.raises(ConvertError):
        convert("squad", FIXTURES / "tatqa.json", tmp_path)


def test_conversion_is_byte_for_byte_deterministic(tmp_path):
    for run in ("a", "b"):
        convert("nq", FIXTURES / "nq_open.jsonl", tmp_path / run, seed=3, n_distractors=2)
    for name in ("corpus.jsonl", "questions.jsonl", "report.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
