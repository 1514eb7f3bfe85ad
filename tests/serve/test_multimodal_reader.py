"""Pixels to the reader: the pipeline with ``llm.multimodal`` sends kept images and the frames of
kept video segments to critic and reader as ``image_url`` parts, read under ``serve.media_root``.

The multimodal backend is a real OpenAI-compatible HTTP server on 127.0.0.1 that records every
request and decodes every image part (as a vision model's processor would): the test is that
the pixels arrive, at their sizes, with their labels and frame times. A text-only backend gets
exactly the messages it got before pictures existed.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from canopy_ray.compressor import Compressor
from canopy_ray.config import load_config
from canopy_ray.core.evidence import render_evidence
from canopy_ray.core.items import parse_item
from canopy_ray.models.llm import client_from_config, reader_call
from canopy_ray.models.llm.vision import MediaError, media_path, read_frames
from canopy_ray.pipeline import LocalBackends, MemoryRetriever, Pipeline, Settings
from tests.openai_stub import chat_handler, serving

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "index"
IMAGE_SIZE = (80, 36)  # (width, height): not the video's 64 x 48, so the two cannot be confused
REPLIES = {"canopy_critic": {"sufficient": True, "missing": "", "next_query": ""},
           "canopy_reader": {"answer": "a cat"}, "canopy_table": {"kind": "lookup"}}


class Recorder:
    """An OpenAI-compatible /v1/chat/completions on 127.0.0.1 that records its requests."""

    def __init__(self, url: str, calls: list):
        self.url, self._calls = url, calls

    @property
    def requests(self) -> list[dict]:
        return [req for _, req in self._calls]


def decoded(content) -> list[tuple[str, np.ndarray, bytes]]:
    """(label, RGB pixels, raw bytes) of each image part, as a processor would read them."""
    from PIL import Image

    out, label = [], None
    for part in content if isinstance(content, list) else []:
        if part["type"] == "text":
            label = part["text"]
        elif part["type"] == "image_url":
            head, b64 = part["image_url"]["url"].split(",", 1)
            assert head.startswith("data:image/") and head.endswith(";base64")
            raw = base64.b64decode(b64)
            with Image.open(io.BytesIO(raw)) as im:
                out.append((label, np.asarray(im.convert("RGB")), raw))
    return out


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    from PIL import Image

    base = tmp_path_factory.mktemp("mm")
    root = base / "media"
    root.mkdir()
    rng = np.random.default_rng(0)
    Image.fromarray((rng.random((IMAGE_SIZE[1], IMAGE_SIZE[0], 3)) * 255).astype(np.uint8)).save(root / "cat.png")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(base / "secret.png")  # outside the root
    shutil.copy(FIXTURES / "tiny70s.mp4", root / "clip.mp4")
    return root


ITEMS = [
    {"id": "cat", "modality": "image", "title": "Cat", "path": "cat.png", "caption": "a grey cat on a sofa"},
    {"id": "clip", "modality": "video", "title": "Test pattern", "path": "clip.mp4", "duration_s": 70,
     "transcript": [{"start": 0, "end": 30, "text": "a cat walks in"}, {"start": 30, "end": 70, "text": "it sleeps"}]},
    {"id": "escape", "modality": "image", "title": "Secret", "path": "../secret.png", "caption": "a cat secret"},
    {"id": "text", "modality": "text", "title": "Cats", "sentences": ["Cats sleep a lot.", "They purr."]},
]


# one more candidate than k: the first round leaves it unseen, so the critic is asked
FILLER = {"id": "filler", "modality": "text", "title": "Tax law", "sentences": ["Tax rates differ by country."]}


def run(minilm, media, url, **llm):
    cfg = load_config(None, llm={"backend": "openai", "url": url, "model": "vl", **llm},
                      serve={"media_root": str(media)}, critic={"rounds": 2, "classify_tables": False},
                      retrieval={"k": len(ITEMS)})
    comp = Compressor(minilm)
    items = [parse_item(o) for o in [*ITEMS, FILLER]]
    pipeline = Pipeline(LocalBackends(minilm, MemoryRetriever(items, minilm, comp), comp, client_from_config(cfg.llm)),
                        Settings.from_config(cfg))
    return pipeline.answer_sync("What is the cat doing?")


@pytest.fixture
def recorder():
    calls: list = []
    reply = lambda req: json.dumps(REPLIES[req["response_format"]["json_schema"]["name"]])  # noqa: E731
    with serving(chat_handler(reply, calls)) as url:
        yield Recorder(url, calls)


def expected_pictures(evidence, media):
    """Per kept piece, in evidence order: the image file, or the video's frames at its node times."""
    out = []
    for p in evidence:
        if p.item_id == "cat":
            out.append(("Image of cat:", IMAGE_SIZE))
        elif p.item_id == "clip":
            out.extend((f"Frame of clip at {t:g} s:", (64, 48)) for _, t in p.media)
    return out


@pytest.mark.integration
def test_pixels_reach_a_multimodal_backend(minilm, media, recorder):
    ans = run(minilm, media, recorder.url, multimodal=True)
    assert [r["response_format"]["json_schema"]["name"] for r in recorder.requests] == ["canopy_critic",
                                                                                        "canopy_reader"]
    want = expected_pictures(ans.evidence, media)
    assert any(label.startswith("Frame") for label, _ in want) and ("Image of cat:", IMAGE_SIZE) in want
    for request in recorder.requests:  # critic and reader alike
        content = request["messages"][-1]["content"]
        assert content[0]["text"].startswith("Evidence:\n") and content[-1]["text"] == "Question: What is the cat doing?"
        got = decoded(content)
        assert [(label, (px.shape[1], px.shape[0])) for label, px, _ in got] == want
        for label, px, raw in got:
            if label == "Image of cat:":  # the file itself, byte for byte
                assert raw == (media / "cat.png").read_bytes()
            else:  # the video's frame at the node's time (JPEG: close, not equal; nearest of all frames)
                t = float(label.rsplit(" at ", 1)[1].removesuffix(" s:"))
                times = [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
                err = {s: np.abs(px.astype(float) - read_frames(media / "clip.mp4", [s])[0]).mean() for s in times}
                assert err[t] < 3 and err[t] == min(err.values()), err
    # the image outside the media root is never read (not in want), and is counted
    escaped = sum(1 for p in ans.evidence if p.item_id == "escape")
    media_counts = ans.to_dict()["media"]
    assert media_counts["sent"] == 2 * len(want)
    assert media_counts.get("skipped_path_outside_media_root", 0) == 2 * escaped


@pytest.mark.integration
def test_image_budget_keeps_the_newest_evidence(minilm, media, recorder):
    ans = run(minilm, media, recorder.url, multimodal=True, max_images=2)
    assert len(expected_pictures(ans.evidence, media)) > 2
    want, left = [], 2  # newest pieces first; a video cut short keeps its first frames
    for p in reversed(ans.evidence):
        labels = [label for label, _ in expected_pictures([p], media)][:left]
        want, left = labels + want, left - len(labels)
    got = decoded(recorder.requests[-1]["messages"][-1]["content"])
    assert [label for label, _, _ in got] == want and len(got) == 2


@pytest.mark.integration
def test_text_only_backend_messages_are_unchanged(minilm, media, recorder):
    ans = run(minilm, media, recorder.url, multimodal=False)
    reader = recorder.requests[-1]
    assert json.dumps(reader["messages"]) == json.dumps(
        reader_call("What is the cat doing?", render_evidence(ans.evidence)).messages)
    assert all(isinstance(r["messages"][-1]["content"], str) for r in recorder.requests)
    assert "media" not in ans.to_dict() and "media" not in ans.timings


def test_media_paths_stay_under_the_root(media, tmp_path):
    assert media_path("cat.png", media) == (media / "cat.png").resolve()
    (media / "link.png").unlink(missing_ok=True)
    (media / "link.png").symlink_to(media.parent / "secret.png")  # a link out of the root
    for path, reason in [("../secret.png", "path_outside_media_root"), (str(media.parent / "secret.png"),
                                                                         "path_outside_media_root"),
                         ("link.png", "path_outside_media_root"), ("nope.png", "missing_file")]:
        with pytest.raises(MediaError) as e:
            media_path(path, media)
        assert e.value.reason == reason
    with pytest.raises(MediaError) as e:
        media_path("cat.png", None)
    assert e.value.reason == "no_media_root"
    (media / "link.png").unlink()


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="the ffmpeg command is not installed")
def test_ffmpeg_frames_match_decord(media):
    from canopy_ray.models.llm.vision import _ffmpeg_frame

    for t in (0.0, 10.0, 40.0):
        ff = _ffmpeg_frame(media / "clip.mp4", t).astype(float)
        ref = read_frames(media / "clip.mp4", [t])[0].astype(float)
        assert ff.shape == ref.shape and np.abs(ff - ref).mean() < 8
