"""The manifest: written last with a checksum over the files it names; read with clear errors."""

import json

import pytest

from canopy_ray.index.manifest import FORMAT, ITEMS, MANIFEST, clear, read_manifest, write_manifest


def _files(root):
    (root / ITEMS).write_bytes(b"items")
    (root / "nodes.f16.npy").write_bytes(b"nodes")
    return {"count": 0, "shards": [{"file": "shard-000.faiss", "sha256": "ab"}],
            "node_store": {"vectors": "nodes.f16.npy"}}


def test_round_trip_and_checksum_follows_the_files(tmp_path):
    entries = _files(tmp_path)
    write_manifest(tmp_path, entries)
    m = read_manifest(tmp_path)
    assert m["format"] == FORMAT and m["count"] == 0 and len(m["checksum"]) == 64
    write_manifest(tmp_path, entries)
    assert read_manifest(tmp_path)["checksum"] == m["checksum"]  # same files, same checksum
    (tmp_path / ITEMS).write_bytes(b"changed")
    write_manifest(tmp_path, entries)
    assert read_manifest(tmp_path)["checksum"] != m["checksum"]


def test_missing_or_foreign_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an index directory"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps({"format": "other/9"}))
    with pytest.raises(ValueError, match="unknown index format"):
        read_manifest(tmp_path)
    clear(tmp_path)
    assert not (tmp_path / MANIFEST).exists()
