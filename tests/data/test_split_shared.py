"""The document-level split on the real converted sets: no test document trains or tunes."""

from pathlib import Path

import pytest

from canopy_ray.core.splits import assign_splits
from canopy_ray.data.sets import SHARED_SETS, load_dataset, prepare_shared

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
pytestmark = [pytest.mark.shared_data,
              pytest.mark.skipif(not SHARED.is_dir(), reason=f"needs the shared data sets at {SHARED}")]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    dirs = prepare_shared(SHARED, tmp_path_factory.mktemp("sets"))
    return {name: load_dataset(d)[1] for name, d in dirs.items()}


@pytest.mark.parametrize("name", sorted(SHARED_SETS))
def test_no_document_is_shared_across_splits(converted, name):
    # every item a question refers to, gold or candidate (HotpotQA's distractor paragraphs,
    # NQ's distractor passages, TAT-QA's report), belongs to one split only
    questions = converted[name]
    splits = assign_splits(questions)
    seen: dict[str, tuple[str, str]] = {}
    leaked = set()
    for q in questions:
        for item in (*(g.item_id for g in q.gold), *q.candidates):
            split, qid = seen.setdefault(item, (splits[q.id], q.id))
            if split != splits[q.id]:
                leaked.add((item, qid, q.id))
    assert not leaked, (name, len(leaked), sorted(leaked)[:5])
    assert set(splits.values()) == {"train", "validation", "test"}, name


def test_hotpotqa_files_are_one_set(converted):
    # the two files share 23 paragraphs: split apart, 7 questions would change split
    assert len(converted["hotpotqa"]) == 800
