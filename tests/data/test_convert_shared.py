"""The converters on the real files in ../shared/data (skipped where that copy is absent)."""

import pytest

from canopy_ray.data.convert import convert
from tests.data._support import SHARED_DATA, assert_canonical

pytestmark = [
    pytest.mark.shared_data,
    pytest.mark.skipif(not SHARED_DATA.is_dir(),
                       reason=f"needs the shared data sets at {SHARED_DATA} (absent in a user's clone)"),
]

CASES = [  # format, file, questions, least share of gold entries located
    ("hotpotqa", "hotpotqa/hotpotqa_distractor_dev700.jsonl", 700, 0.99),
    ("hotpotqa", "hotpotqa/hotpotqa_train100.json", 100, 0.99),
    ("nq", "nq/nq_open_oracle_1655.jsonl.gz", 1655, 0.95),
    ("tatqa", "tatqa/tatqa_dev.json", 1668, 0.70),
]


@pytest.mark.parametrize("fmt, rel, n_questions, least_located", CASES, ids=[c[1] for c in CASES])
def test_real_file(tmp_path, fmt, rel, n_questions, least_located):
    import json

    report = convert(fmt, SHARED_DATA / rel, tmp_path)
    assert report.questions == n_questions
    assert not report.skipped
    assert report.located_share >= least_located
    items = [json.loads(line) for line in (tmp_path / "corpus.jsonl").read_text().splitlines()]
    questions = [json.loads(line) for line in (tmp_path / "questions.jsonl").read_text().splitlines()]
    assert len(items) == report.items and len(questions) == n_questions
    assert_canonical(items, questions)
