"""The Qwen3-VL-Embedding path on a tiny randomly initialised Qwen3-VL (no download)."""

from pathlib import Path

import numpy as np
import pytest

from canopy_ray.config import load_config
from canopy_ray.core.evidence import Piece, piece
from canopy_ray.core.hierarchy import build_tree
from canopy_ray.core.items import VideoItem
from canopy_ray.models.encoder import build_encoder
from canopy_ray.models.qwen3vl import Qwen3VLEncoder, build_tiny_qwen3vl

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "index"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_qwen3vl(tmp_path_factory.mktemp("tiny-qwen3vl"))


@pytest.fixture(scope="module")
def enc(tiny_dir):
    return Qwen3VLEncoder(tiny_dir, device="cpu", batch_size=4, max_frame_pixels=64 * 64)


@pytest.fixture(scope="module")
def image_path(tmp_path_factory):
    from PIL import Image

    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("img") / "noise.png"
    Image.fromarray((rng.random((60, 80, 3)) * 255).astype(np.uint8)).save(path)
    return path


def unit_rows(x):
    return np.allclose(np.linalg.norm(x, axis=1), 1, atol=1e-5)


def test_text_queries(enc):
    q = enc.encode_queries(["what is the capital of France?", "jupiter moons"])
    assert q.shape == (2, 64) and unit_rows(q) and not np.allclose(q[0], q[1])
    assert enc.dim == 64 and enc.adapter_id == "frozen"


def test_image_node_uses_pixels(enc, image_path):
    with_img = Piece("i", "image", ((0, 1),), "noise", media=((str(image_path), None),))
    text_only = Piece("i", "image", ((0, 1),), "noise")
    v = enc.encode_nodes([with_img, text_only])
    assert unit_rows(v) and np.abs(v[0] - v[1]).max() > 1e-4


def test_video_frames_as_pixels(enc):
    rng = np.random.default_rng(1)
    frames = (rng.random((3, 48, 64, 3)) * 255).astype(np.uint8)  # odd count: padded to a pair
    px, grid = enc.frames_input(frames)
    assert grid.tolist() == [2, 4, 4] and px.shape == (2 * 4 * 4, 3 * 2 * 16 * 16)
    a = enc.encode_frames(frames, [0.0, 10.0, 20.0], "clip")
    b = enc.encode_frames(frames[::-1].copy(), [0.0, 10.0, 20.0], "clip")
    assert a.shape == (64,) and np.isclose(np.linalg.norm(a), 1) and np.abs(a - b).max() > 1e-4


def test_video_node_decoded_with_decord(enc):
    item = VideoItem("v", "Test pattern", str(FIXTURES / "tiny70s.mp4"), 70.0)
    tree = build_tree(item)  # two segments: 0-30 s (frames 0, 10, 20) and 30-70 s (30..60)
    nodes = [piece(tree, [n.span]) for n in tree.nodes()]
    assert [len(p.media) for p in nodes] == [7, 3, 4]
    v = enc.encode_nodes(nodes)
    assert v.shape == (3, 64) and unit_rows(v) and np.abs(v[1] - v[2]).max() > 1e-4


def test_batches_equal_single_inputs(enc, image_path):
    ps = [Piece("a", "image", ((0, 1),), "x", media=((str(image_path), None),)),
          Piece("b", "text", ((0, 1),), "a longer text node with more tokens than the others"),
          Piece("c", "text", ((0, 1),), "short")]
    together = enc.encode_nodes(ps)
    alone = np.concatenate([enc.encode_nodes([p]) for p in ps])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_zero_lora_equals_f0_and_factory(tiny_dir, enc, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3VLModel

    model = get_peft_model(Qwen3VLModel.from_pretrained(tiny_dir),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model.save_pretrained(tmp_path / "lora")
    cfg = load_config(None, models={"encoder": "qwen3-vl", "encoder_path": str(tiny_dir),
                                    "adapter": str(tmp_path / "lora"), "device": "cpu", "batch_size": 2})
    f_theta = build_encoder(cfg.models)
    assert isinstance(f_theta, Qwen3VLEncoder) and f_theta.adapter_id.startswith("lora-")
    ps = [Piece("a", "text", ((0, 1),), "Paris is the capital of France.")]
    np.testing.assert_allclose(f_theta.encode_nodes(ps), enc.encode_nodes(ps), atol=1e-5)


# ---- the published usage: checkpoint layout, content order, pixel bounds, truncation ----------

def test_published_layout_loads_every_weight(tiny_dir, enc, tmp_path):
    """The tiny checkpoint is saved as Qwen3-VL-Embedding is (weights under the wrapper's
    ``model.`` prefix); it loads into the same vectors as the plain layout of the same weights."""
    import json

    from safetensors import safe_open

    with safe_open(str(tiny_dir / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and all(k.startswith("model.") for k in keys)
    assert json.loads((tiny_dir / "config.json").read_text())["architectures"] == ["Qwen3VLForEmbedding"]
    plain = Qwen3VLEncoder(build_tiny_qwen3vl(tmp_path / "plain", layout="plain"), device="cpu")
    ps = [Piece("a", "text", ((0, 1),), "Paris is the capital of France.")]
    np.testing.assert_allclose(enc.encode_nodes(ps), plain.encode_nodes(ps), atol=1e-6)
    assert np.allclose(enc.encode_queries(["q"]), plain.encode_queries(["q"]), atol=1e-6)


def test_checkpoint_with_unloadable_weights_is_an_error(tiny_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(tiny_dir, bad)
    state = load_file(str(bad / "model.safetensors"))
    save_file({k.replace("model.", "encoder.", 1): v for k, v in state.items()}, str(bad / "model.safetensors"),
              metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing"):
        Qwen3VLEncoder(bad, device="cpu")


def _runs(enc, ids):
    """The sample's token kinds in order, runs collapsed: 'video', 'image', 'text' (after the user turn)."""
    start = len(enc._ids(f"<|im_start|>system\n{enc.doc_instruction}<|im_end|>\n<|im_start|>user\n"))
    kinds = []
    for i in ids[start:]:
        kind = {enc.image_token_id: "image", enc.video_token_id: "video"}.get(i)
        if kind is None and i in enc.special_ids:
            continue
        kind = kind or "text"
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
    return kinds


def test_content_order_video_image_text_and_null(enc):
    rng = np.random.default_rng(2)
    img = (rng.random((40, 40, 3)) * 255).astype(np.uint8)
    frames = (rng.random((2, 48, 64, 3)) * 255).astype(np.uint8)
    both = enc._sample(enc.doc_instruction, "words", [img], [(frames, [0.0, 10.0])])
    # the video's timestamp "<5.0 seconds>" is text before its pads
    assert _runs(enc, both["ids"]) == ["text", "video", "image", "text"]
    null = enc._ids("NULL")
    tail = enc._ids("<|im_end|>\n<|im_start|>assistant\n")

    def has_null(ids):
        body = ids[: len(ids) - len(tail)]
        return body[-len(null):] == null

    assert not has_null(enc._sample(enc.doc_instruction, "", [img], [])["ids"])  # image only: no NULL
    assert not has_null(enc._sample(enc.doc_instruction, "", [], [(frames, [0.0, 10.0])])["ids"])
    assert has_null(enc._sample(enc.doc_instruction, "", [], [])["ids"])  # nothing at all: NULL


def test_image_pixel_bounds_and_a_single_resize(enc):
    from canopy_ray.models.qwen3vl import MAX_PIXELS, MIN_PIXELS

    assert (MIN_PIXELS, MAX_PIXELS) == (4 * 32 * 32, 1800 * 32 * 32)
    small = np.zeros((20, 30, 3), np.uint8)
    big = np.zeros((1900, 1400, 3), np.uint8)
    for image in (small, big):
        h, w = enc.resized_image(image).shape[:2]
        assert h % 32 == 0 and w % 32 == 0 and MIN_PIXELS <= h * w <= MAX_PIXELS
        _, grid = enc._image_input(image)
        assert grid.tolist() == [1, h // 16, w // 16]  # the processor kept our size: no second resize
    assert enc.resized_image(big).shape[:2] == (1568, 1152)  # beta = sqrt(1900*1400/MAX) = 1.201: 1581 -> 1568


def test_truncation_keeps_special_tokens(tiny_dir, image_path):
    from PIL import Image

    full = Qwen3VLEncoder(tiny_dir, device="cpu")
    short = Qwen3VLEncoder(tiny_dir, device="cpu", max_length=40)
    img = np.asarray(Image.open(image_path).convert("RGB"))
    text = "a long passage " * 40
    long_ids = full._sample(full.doc_instruction, text, [img], [])["ids"]
    ids = short._sample(short.doc_instruction, text, [img], [])["ids"]
    special = [i for i in long_ids if i in full.special_ids]
    assert len(long_ids) > 40 and len(special) < 40
    assert len(ids) == 40 and [i for i in ids if i in short.special_ids] == special  # every one kept, in order
    plain = [i for i in long_ids if i not in full.special_ids]
    assert [i for i in ids if i not in short.special_ids] == plain[: 40 - len(special)]  # the head of the rest
    assert ids.count(short.image_token_id) == long_ids.count(full.image_token_id) > 0
    assert ids[-1] == short.tokenizer.convert_tokens_to_ids("<|im_start|>")  # the closing markers survive
    v = short.encode_nodes([Piece("i", "image", ((0, 1),), text, media=((str(image_path), None),))])
    assert v.shape == (1, 64) and unit_rows(v)  # placeholders still match the pixels
