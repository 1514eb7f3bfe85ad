"""The manifest: written last with checksums of the files it names; read with clear errors
that name the file and the command that rebuilds the index."""

import json
import shlex

import pytest

from canopy_ray.core.errors import CorruptFileError
from canopy_ray.indexer import build_parser
from canopy_ray.index.manifest import (CONFIG, FORMAT, ITEMS, MANIFEST, clear, read_manifest, rebuild_command,
                                       write_job_files, write_manifest)


def _files(root):
    (root / ITEMS).write_bytes(b"items")
    for name in ("nodes.f16.npy", "node_spans.npy", "node_items.parquet"):
        (root / name).write_bytes(name.encode())
    return {"count": 0, "shards": [{"file": "shard-000.faiss", "sha256": "ab"}],
            "node_store": {"vectors": "nodes.f16.npy", "spans": "node_spans.npy", "items": "node_items.parquet"}}


def test_round_trip_and_checksum_follows_the_files(tmp_path):
    entries = _files(tmp_path)
    write_manifest(tmp_path, entries)
    m = read_manifest(tmp_path)
    assert m["format"] == FORMAT and m["count"] == 0 and len(m["checksum"]) == 64
    assert sorted(m["files"]) == sorted([ITEMS, "nodes.f16.npy", "node_spans.npy", "node_items.parquet"])
    write_manifest(tmp_path, entries)
    assert read_manifest(tmp_path)["checksum"] == m["checksum"]  # same files, same checksum
    (tmp_path / ITEMS).write_bytes(b"changed")
    write_manifest(tmp_path, entries)
    m2 = read_manifest(tmp_path)
    assert m2["checksum"] != m["checksum"] and m2["files"][ITEMS] != m["files"][ITEMS]


def test_missing_or_foreign_manifest_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an index directory"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST).write_text(json.dumps({"format": "other/9"}))
    with pytest.raises(ValueError, match="unknown index format"):
        read_manifest(tmp_path)
    clear(tmp_path)
    assert not (tmp_path / MANIFEST).exists()


def test_torn_manifest_names_the_file_and_the_rebuild_command(tmp_path):
    corpus = tmp_path / "data" / "corpus.jsonl"
    corpus.parent.mkdir()
    corpus.write_text("{}\n")
    out = tmp_path / "my index"  # a space: the command must quote it
    write_job_files(out, {"index": {"shard_items": 4}}, corpus, corpus.parent)
    write_manifest(out, _files(out))
    text = (out / MANIFEST).read_text()
    (out / MANIFEST).write_text(text[: len(text) // 2])  # a torn write
    with pytest.raises(CorruptFileError) as e:
        read_manifest(out)
    assert e.value.path == str(out / MANIFEST) and "not valid JSON" in str(e.value)
    argv = shlex.split(e.value.rebuild)
    assert argv[:2] == ["canopy", "index"] and e.value.rebuild in str(e.value)
    args = build_parser().parse_args(argv[2:])  # a command `canopy index` accepts as it is
    assert (args.config, args.corpus, args.out) == (str(out / CONFIG), str(corpus), str(out))
    assert args.media_root is None and not args.overwrite  # reuses the job's finished parts


def test_rebuild_command_without_job_files_says_what_to_fill_in(tmp_path):
    cmd = rebuild_command(tmp_path)
    assert cmd == f"canopy index --config CONFIG --corpus CORPUS --out {tmp_path.resolve()} --overwrite"
    media = tmp_path / "media"
    write_job_files(tmp_path, {}, tmp_path / "c.jsonl", media)
    assert shlex.split(rebuild_command(tmp_path))[-2:] == ["--media-root", str(media)]
