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
