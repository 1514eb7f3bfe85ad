"""Without decord (no wheels for Apple Silicon or Linux aarch64), video fails with an error that
names the ``video`` extra, instead of every video item being skipped as unreadable."""

import json
import sys
from pathlib import Path

import pytest

from canopy_ray.index.ingest import validate_row
from canopy_ray.models.media import MissingExtraError, import_decord

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "index"
VIDEO = next(line for line in (FIXTURES / "corpus.jsonl").read_text().splitlines() if '"vid0"' in line)


def test_with_decord_the_video_item_is_read():
    pytest.importorskip("decord")
    assert import_decord().__name__ == "decord"
    assert validate_row(VIDEO, FIXTURES)[:3] == ("vid0", "video", "")


def test_without_decord_video_fails_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "decord", None)  # makes `import decord` raise ImportError
    with pytest.raises(MissingExtraError, match=r'pip install "canopy-ray\[video\]"'):
        import_decord()
    with pytest.raises(MissingExtraError, match=r"canopy-ray\[video\]"):
        validate_row(VIDEO, FIXTURES)  # an error for the job, not an ItemError for one item
    text = json.dumps({"id": "t", "modality": "text", "title": "T", "text": "Text needs no decord."})
    assert validate_row(text, FIXTURES)[2] == ""
    from canopy_ray.models.qwen3vl import read_frames  # the GPU encoder's frame reader says the same

    with pytest.raises(MissingExtraError, match="video"):
        read_frames(str(FIXTURES / "tiny70s.mp4"), [0.0])
