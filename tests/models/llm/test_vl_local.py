"""Pixels reach an in-process multimodal backend: a tiny random Qwen3-VL generation model.

The checkpoint is built from a config (random weights, the byte-level tokenizer and image
processor of ``build_tiny_qwen3vl``, a Qwen-style chat template), so its answers are noise. The
test is what its processor is given and returns for the reader's real messages: one
``<|image_pad|>`` run per picture :mod:`canopy_ray.models.llm.vision` sent, each the length
of its image's patch grid, and ``pixel_values`` rows for exactly those grids, the image file's
own pixels among them. The processor is wrapped only to keep what it returns.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from canopy_ray.core.evidence import Piece, render_evidence
from canopy_ray.models.llm import LLMRequestError, make_client, reader_call, run_role
from canopy_ray.models.llm.vision import evidence_pictures
from canopy_ray.models.qwen3vl import build_tiny_qwen3vl, smart_resize

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "index"
IMAGE_SIZE = (80, 36)  # (width, height); the video is 64 x 48
FRAME_TIMES = (0.0, 10.0, 20.0)
# Qwen3-VL's template reduced to what the roles send: text, image parts and the generation prompt
CHAT_TEMPLATE = (
    "{%- for m in messages -%}<|im_start|>{{ m['role'] }}\n"
    "{%- if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif p['type'] == 'text' %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor -%}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}")


def build_tiny_vl(out: Path) -> Path:
    """A random Qwen3VLForConditionalGeneration saved with the tiny tokenizer and processor."""
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    build_tiny_qwen3vl(out, layout="plain")
    for f in out.glob("model*.safetensors*"):
        f.unlink()
    torch.manual_seed(0)
    Qwen3VLForConditionalGeneration(Qwen3VLConfig.from_pretrained(out)).eval().save_pretrained(out)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return out


class KeepOutputs:
    """The backend's real processor, keeping (images given, tensors returned) per call."""

    def __init__(self, processor):
        self.processor, self.calls = processor, []

    def __getattr__(self, name):
        return getattr(self.processor, name)

    def __call__(self, *, text, images=None, **kw):
        out = self.processor(text=text, images=images, **kw) if images else self.processor(text=text, **kw)
        self.calls.append((list(images or []), out))
        return out


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    model_dir = build_tiny_vl(tmp_path_factory.mktemp("tiny-qwen3vl-gen"))
    c = make_client("local-vl", model_dir=str(model_dir), max_new_tokens=16, threads=1)
    c.backend.processor = KeepOutputs(c.backend.processor)
    return c


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("media")
    rng = np.random.default_rng(0)
    Image.fromarray((rng.random((IMAGE_SIZE[1], IMAGE_SIZE[0], 3)) * 255).astype(np.uint8)).save(root / "cat.png")
    shutil.copy(FIXTURES / "tiny70s.mp4", root / "clip.mp4")
    return root


def runs(ids: list[int], token: int) -> list[int]:
    """Lengths of the runs of ``token`` in ``ids``."""
    out, prev = [], None
    for t in ids:
        if t == token:
            if prev == token:
                out[-1] += 1
            else:
                out.append(1)
        prev = t
    return out


def expected_grid(width: int, height: int, ip) -> list[int]:
    factor = ip.patch_size * ip.merge_size
    h, w = smart_resize(height, width, factor, ip.size["shortest_edge"], ip.size["longest_edge"])
    return [1, h // ip.patch_size, w // ip.patch_size]


def test_reader_pictures_reach_the_processor(client, media):
    from PIL import Image

    evidence = [Piece("cat", "image", ((0, 1),), "a grey cat on a sofa", media=(("cat.png", None),)),
                Piece("clip", "video", ((0, 30),), "a cat walks in", media=tuple(("clip.mp4", t) for t in FRAME_TIMES))]
    pictures, skipped = evidence_pictures(evidence, media, budget=8)
    assert not skipped and len(pictures) == 1 + len(FRAME_TIMES)

    proc = client.backend.processor
    out = run_role(client, reader_call("What is the cat doing?", render_evidence(evidence), images=pictures))
    assert out.error is None or not out.error.startswith(("bad_request", "error")), out.error

    images, got = proc.calls[-1]
    assert [im.size for im in images] == [IMAGE_SIZE] + [(64, 48)] * len(FRAME_TIMES)
    ids = got["input_ids"][0].tolist()
    assert out.prompt_tokens == len(ids)  # the model was given this prompt
    ip = proc.image_processor
    want = [expected_grid(*im.size, ip) for im in images]
    assert got["image_grid_thw"].tolist() == want
    merged = [int(np.prod(g)) // ip.merge_size ** 2 for g in want]
    assert runs(ids, proc.image_token_id) == merged  # one run per picture, in order, its patches long
    rows = [int(np.prod(g)) for g in want]
    assert got["pixel_values"].shape[0] == sum(rows)
    # the image file's own pixels (PNG, lossless) are the first picture's patches
    own = ip(images=[Image.open(media / "cat.png").convert("RGB")], return_tensors="pt")["pixel_values"]
    np.testing.assert_allclose(got["pixel_values"][:rows[0]].numpy(), own.numpy(), atol=1e-6)
    # the three frames are three different pictures
    frames = got["pixel_values"][rows[0]:].reshape(len(FRAME_TIMES), rows[1], -1)
    assert all(float((frames[i] - frames[j]).abs().max()) > 0.1 for i in range(3) for j in range(i))


def test_text_only_request_has_no_pixels(client):
    proc = client.backend.processor
    out = run_role(client, reader_call("What is the cat doing?", "[cat] a grey cat on a sofa"))
    images, got = proc.calls[-1]
    assert images == [] and "pixel_values" not in got and "image_grid_thw" not in got
    ids = got["input_ids"][0].tolist()
    assert proc.image_token_id not in ids and out.prompt_tokens == len(ids)


def test_reader_json_is_grammar_constrained(client):
    """Noise, but schema-shaped noise: the reply starts as the reader's JSON object."""
    out = run_role(client, reader_call("What is the cat doing?", "[cat] a grey cat on a sofa"))
    assert out.content.startswith('{"answer": "')
    assert out.finish_reason in ("stop", "length") and 0 < out.completion_tokens <= 48


def test_non_data_urls_are_refused(client):
    from canopy_ray.models.llm.vl_local import handle_chat_completion

    msg = [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                        {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}]}]
    with pytest.raises(LLMRequestError) as e:
        handle_chat_completion({"messages": msg}, client.backend)
    assert e.value.status == 400 and e.value.param == "messages[0].content[1]"
    out = run_role(client, reader_call("q", "e", images=["data:image/png;base64,bm90IGFuIGltYWdl"]))
    assert out.failed and out.error.startswith("bad_request")


def test_config_selects_local_vl(client):
    from canopy_ray.config import load_config
    from canopy_ray.models.llm import client_from_config

    cfg = load_config(None, llm={"backend": "local-vl", "model_dir": str(client.backend.model_dir),
                                 "multimodal": True, "max_new_tokens": 4})
    c = client_from_config(cfg.llm)
    assert type(c).__name__ == "VLChatClient" and c.backend.max_new_tokens == 4
    with pytest.raises(ValueError, match="model_dir"):
        make_client("local-vl")


@pytest.mark.integration
def test_pipeline_sends_its_kept_pictures(client, media, minilm):
    """The whole pipeline (retrieval, compression, critic, reader) on ``local-vl``: every prompt's
    pictures reach the processor, and the reader's are the kept evidence's image and frames."""
    from canopy_ray.compressor import Compressor
    from canopy_ray.config import load_config
    from canopy_ray.core.items import parse_item
    from canopy_ray.pipeline import LocalBackends, MemoryRetriever, Pipeline, Settings

    cfg = load_config(None, llm={"backend": "local-vl", "model_dir": str(client.backend.model_dir),
                                 "multimodal": True}, serve={"media_root": str(media)},
                      critic={"rounds": 2, "classify_tables": False}, retrieval={"k": 3})
    items = [parse_item(o) for o in [  # k = 3 of 4: the critic is asked (an unseen candidate is left)
        {"id": "cat", "modality": "image", "title": "Cat", "path": "cat.png", "caption": "a grey cat on a sofa"},
        {"id": "clip", "modality": "video", "title": "Test pattern", "path": "clip.mp4", "duration_s": 70,
         "transcript": [{"start": 0, "end": 30, "text": "a cat walks in"},
                        {"start": 30, "end": 70, "text": "it sleeps"}]},
        {"id": "text", "modality": "text", "title": "Cats", "sentences": ["Cats sleep a lot.", "They purr."]},
        {"id": "filler", "modality": "text", "title": "Tax law", "sentences": ["Tax rates differ by country."]}]]
    comp = Compressor(minilm)
    proc = client.backend.processor
    before = len(proc.calls)
    ans = Pipeline(LocalBackends(minilm, MemoryRetriever(items, minilm, comp), comp, client),
                   Settings.from_config(cfg)).answer_sync("What is the cat doing?")
    calls = proc.calls[before:]
    assert len(calls) >= 2  # critic(s), then the reader
    for images, got in calls:
        assert runs(got["input_ids"][0].tolist(), proc.image_token_id) == [
            int(np.prod(g)) // proc.image_processor.merge_size ** 2 for g in got["image_grid_thw"].tolist()]
        assert len(images) == len(got["image_grid_thw"])
    want = [IMAGE_SIZE if p.item_id == "cat" else (64, 48) for p in ans.evidence for _ in p.media]
    assert any(p.item_id == "clip" for p in ans.evidence) and ("cat" in {p.item_id for p in ans.evidence})
    assert [im.size for im in calls[-1][0]] == want and ans.to_dict()["media"]["sent"] > 0
