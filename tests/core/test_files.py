"""Atomic writes never leave half a file; hash-keyed arrays are computed once per key."""

import json

import numpy as np
import pytest

from canopy_ray.core.files import (atomic_path, cached_array, digest, sha256_files, under_root, write_json,
                                   write_jsonl)


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "out.json"
    write_json(target, {"v": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text('{"v": 2, "half')
            raise RuntimeError("killed mid-write")
    assert json.loads(target.read_text()) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_jsonl_and_suffix_kept_for_writers_that_check_it(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"x": 1}, {"y": "é"}])
    assert (tmp_path / "a.jsonl").read_text(encoding="utf-8") == '{"x": 1}\n{"y": "é"}\n'
    with atomic_path(tmp_path / "v.npy") as tmp:
        assert tmp.suffix == ".npy"
        np.save(tmp, np.arange(3))  # np.save would append .npy to any other name
    assert np.load(tmp_path / "v.npy").tolist() == [0, 1, 2]


def test_cached_array_computes_once_per_key(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return np.ones(4) * len(calls)

    a = cached_array(tmp_path, "vecs", ["model", ["t1", "t2"]], compute)
    b = cached_array(tmp_path, "vecs", ["model", ["t1", "t2"]], compute)
    c = cached_array(tmp_path, "vecs", ["model", ["t1", "t3"]], compute)
    assert len(calls) == 2 and (a == b).all() and (c == 2).all()
    assert cached_array(None, "vecs", "k", compute)[0] == 3  # no directory: no cache


def test_hashes_are_stable_and_name_sensitive(tmp_path):
    (tmp_path / "a").write_bytes(b"x")
    (tmp_path / "b").write_bytes(b"x")
    assert sha256_files([tmp_path / "a"]) == sha256_files([tmp_path / "b"])
    assert sha256_files([tmp_path / "a"], with_names=True) != sha256_files([tmp_path / "b"], with_names=True)
    assert digest({"b": 1, "a": 2}) == digest({"a": 2, "b": 1}) and len(digest("x", 12)) == 12


def test_under_root_refuses_every_way_out(tmp_path):
    root = tmp_path / "media"
    (root / "a").mkdir(parents=True)
    (root / "a" / "x.png").write_bytes(b"x")
    (tmp_path / "secret.txt").write_text("s")
    (root / "link").symlink_to(tmp_path / "secret.txt")
    assert under_root(root, "a/x.png") == (root / "a" / "x.png").resolve()
    assert under_root(root, "a/../a/x.png") == (root / "a" / "x.png").resolve()
    assert under_root(root, root / "a" / "x.png") == (root / "a" / "x.png").resolve()  # absolute, inside
    for out in ("../secret.txt", "a/../../secret.txt", tmp_path / "secret.txt", "/etc/passwd", "link"):
        assert under_root(root, out) is None, out
