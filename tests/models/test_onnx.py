"""ONNX Runtime backends of the MiniLM encoders: vectors against torch, the config switch, the disk cache."""

import json
from importlib import resources

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from canopy_ray.config import ConfigError, load_config  # noqa: E402
from canopy_ray.core.evidence import Piece, piece  # noqa: E402
from canopy_ray.core.files import sha256_file  # noqa: E402
from canopy_ray.models import onnx  # noqa: E402
from canopy_ray.models.encoder import TextEncoder, build_encoder  # noqa: E402

ADAPTER = resources.files("canopy_ray") / "assets" / "adapters" / "minilm-canopy"
# Stated tolerances: fp32 equals torch to float noise; dynamic int8 keeps every vector within
# cosine 0.98 of torch's (measured min 0.990 on 1,337 HotpotQA nodes, benchmarks/encode_onnx.py).
FP32_ATOL = 1e-5
INT8_MIN_COS = 0.98


def sample_nodes(n_items: int = 6) -> list[Piece]:
    """Every node of the first bundled sample items, as the engine encodes them."""
    from canopy_ray.core.hierarchy import build_tree
    from canopy_ray.core.items import parse_item

    corpus = resources.files("canopy_ray") / "assets" / "sample" / "corpus.jsonl"
    objs = [json.loads(x) for x in corpus.read_text().splitlines() if x.strip()][:n_items]
    trees = [build_tree(parse_item(o), 2) for o in objs]
    return [piece(t, [n.span]) for t in trees for n in t.nodes()]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="module")
def torch_enc():
    return TextEncoder(adapter=str(ADAPTER))


@pytest.fixture(scope="module")
def nodes():
    return sample_nodes()


def test_fp32_equals_torch_on_real_nodes(cache, torch_enc, nodes):
    enc = TextEncoder(adapter=str(ADAPTER), backend="onnx", onnx_cache=cache)
    assert len(nodes) > 20 and enc.sessions and enc.node_model is None  # no merged torch copy kept
    np.testing.assert_allclose(enc.encode_nodes(nodes), torch_enc.encode_nodes(nodes), atol=FP32_ATOL)
    texts = [p.text for p in nodes]
    np.testing.assert_allclose(enc.encode_queries(texts), torch_enc.encode_queries(texts), atol=FP32_ATOL)
    # f_theta and f0 are different graphs: the adapter really is in the node model
    assert np.abs(enc.encode_nodes(nodes) - enc.encode_queries(texts)).max() > 1e-2


def test_int8_within_tolerance_on_real_nodes(cache, torch_enc, nodes):
    enc = TextEncoder(adapter=str(ADAPTER), backend="onnx-int8", onnx_cache=cache)
    got, ref = enc.encode_nodes(nodes), torch_enc.encode_nodes(nodes)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    assert (got * ref).sum(1).min() >= INT8_MIN_COS
    texts = [p.text for p in nodes]
    assert (enc.encode_queries(texts) * torch_enc.encode_queries(texts)).sum(1).min() >= INT8_MIN_COS


def test_config_backend_switches_the_engine(cache, torch_enc, nodes, monkeypatch):
    monkeypatch.setenv("CANOPY_ONNX_CACHE", str(cache))
    ref = torch_enc.encode_nodes(nodes)
    fp32 = build_encoder(load_config(None, models={"adapter": str(ADAPTER), "backend": "onnx"}).models)
    assert fp32.backend == "onnx"
    fp32.model = None  # torch is gone: only ONNX Runtime can produce these vectors
    np.testing.assert_allclose(fp32.encode_nodes(nodes), ref, atol=FP32_ATOL)
    int8 = build_encoder(load_config(None, models={"adapter": str(ADAPTER), "backend": "onnx-int8"}).models)
    assert np.abs(int8.encode_nodes(nodes) - ref).max() > 1e-3  # a quantised model, not torch
    plain = build_encoder(load_config(None, models={"adapter": str(ADAPTER), "backend": "torch"}).models)
    assert not plain.sessions and plain.node_model is not None
    np.testing.assert_allclose(plain.encode_nodes(nodes), ref, atol=1e-6)
    with pytest.raises(ConfigError, match="backend"):
        load_config(None, models={"backend": "tensorrt"})
    with pytest.raises(ValueError, match="CPU only"):
        TextEncoder(backend="onnx", device="meta", onnx_cache=cache)


def tiny_bert(seed: int):
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64)
    return BertModel(cfg).eval()


def tiny_vectors(sess, model) -> tuple[np.ndarray, np.ndarray]:
    """(ONNX, torch) unit vectors of a padded batch through ``model``."""
    import torch

    from canopy_ray.models.encoder import mean_pool

    ids = np.array([[2, 5, 9, 11, 3], [2, 7, 3, 0, 0]], np.int64)
    mask = (ids > 0).astype(np.int64)
    with torch.inference_mode():
        ref = mean_pool(model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
                        .last_hidden_state, torch.from_numpy(mask)).numpy()
    return onnx.run_session(sess, ids, mask), ref


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8"])
def test_cache_reused_and_rebuilt_after_corruption(tmp_path, backend):
    model = tiny_bert(0)
    exports = []

    def build(path):
        exports.append(path)
        onnx.export_fp32(model, path, 4, 32)

    key = onnx.cache_key("tiny", "base-sha", "adapter-sha", backend)
    sess = onnx.cached_session(tmp_path, key, backend, build, threads=1)
    got, ref = tiny_vectors(sess, model)
    np.testing.assert_allclose(got, ref, atol=1e-5 if backend == "onnx" else 0.1)
    path = tmp_path / f"{key}.onnx"
    manifest = json.loads(path.with_suffix(".json").read_text())
    assert manifest["sha256"] == sha256_file(path) and len(exports) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{key}.json", f"{key}.onnx"]  # no temp files left

    onnx.cached_session(tmp_path, key, backend, build, threads=1)
    assert len(exports) == 1  # reused

    data = bytearray(path.read_bytes())  # flip bytes in the middle: same size, wrong content
    data[len(data) // 2:len(data) // 2 + 64] = bytes(64)
    path.write_bytes(bytes(data))
    sess = onnx.cached_session(tmp_path, key, backend, build, threads=1)
    assert len(exports) == 2 and json.loads(path.with_suffix(".json").read_text())["sha256"] == sha256_file(path)
    np.testing.assert_allclose(tiny_vectors(sess, model)[0], got, atol=1e-6)

    path.write_bytes(b"not a model")  # truncated file, manifest intact
    onnx.cached_session(tmp_path, key, backend, build, threads=1)
    path.unlink()  # missing file
    onnx.cached_session(tmp_path, key, backend, build, threads=1)
    path.with_suffix(".json").unlink()  # missing manifest (a write killed between the two renames)
    onnx.cached_session(tmp_path, key, backend, build, threads=1)
    path.write_bytes(b"garbage whose hash the manifest holds")  # ONNX Runtime refuses it
    path.with_suffix(".json").write_text(json.dumps({"sha256": sha256_file(path)}))
    onnx.cached_session(tmp_path, key, backend, build, threads=1)
    assert len(exports) == 6
    np.testing.assert_allclose(tiny_vectors(onnx.session(path, 1), model)[0], got, atol=1e-6)


def test_cache_key_names_everything_the_export_depends_on():
    base = onnx.cache_key("m", "b", "a", "onnx")
    others = [onnx.cache_key("m2", "b", "a", "onnx"), onnx.cache_key("m", "b2", "a", "onnx"),
              onnx.cache_key("m", "b", "a2", "onnx"), onnx.cache_key("m", "b", None, "onnx"),
              onnx.cache_key("m", "b", "a", "onnx-int8")]
    assert len({base, *others}) == 6
