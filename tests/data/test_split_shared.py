"""The document-level split on the real converted sets: no test document trains or tunes."""

from pathlib import Path

import pytest

from canopy_ray.core.splits import assign_splits, borrowed_candidates, documents
from canopy_ray.data.sets import SHARED_SETS, load_dataset, prepare_shared

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
pytestmark = [pytest.mark.shared_data,
              pytest.mark.skipif(not SHARED.is_dir(), reason=f"needs the shared data sets at {SHARED}")]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    dirs = prepare_shared(SHARED, tmp_path_factory.mktemp("sets"))
    return {name: load_dataset(d)[1] for name, d in dirs.items()}


def test_no_document_is_shared_across_splits(converted):
    for name in SHARED_SETS:
        questions = converted[name]
        splits, borrowed = assign_splits(questions), borrowed_candidates(questions)
        owner = {}
        for q in questions:
            for key in documents(q, borrowed):
                assert owner.setdefault(key, splits[q.id]) == splits[q.id], (name, q.id, key)
        assert {"train", "validation", "test"} <= set(splits.values()), name
    # TAT-QA: a report's table and paragraphs never straddle two splits
    tat = converted["tatqa"]
    splits, by_item = assign_splits(tat), {}
    for q in tat:
        for item in (*q.candidates, *(g.item_id for g in q.gold)):
            assert by_item.setdefault(item, splits[q.id]) == splits[q.id]
    # NQ and HotpotQA: a test gold paragraph is no training or validation question's gold
    for name in ("nq", "hotpotqa"):
        splits, gold_split = assign_splits(converted[name]), {}
        for q in converted[name]:
            for g in q.gold:
                assert gold_split.setdefault(g.item_id, splits[q.id]) == splits[q.id]


def test_nq_distractors_are_never_gold_passages_of_another_split(converted):
    # NQ's distractors are other questions' gold passages: drawn within the question's split
    for name in ("nq", "tatqa"):
        splits, gold_split = assign_splits(converted[name]), {}
        for q in converted[name]:
            for g in q.gold:
                gold_split[g.item_id] = splits[q.id]
        leaked = [(q.id, c) for q in converted[name] for c in q.candidates
                  if gold_split.get(c, splits[q.id]) != splits[q.id]]
        assert not leaked, (name, len(leaked), leaked[:3])


def test_hotpotqa_files_are_one_set(converted):
    # the two files share paragraphs: split apart, 6 questions would change split
    assert len(converted["hotpotqa"]) == 800
