"""Small file helpers every layer uses: atomic writes, content hashes, hash-keyed arrays.

A killed process must never leave half a file that a later run takes for a finished one,
so every result file is written to a temporary name beside its target and renamed over it
(``os.replace`` is atomic within one file system).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``, on error it is removed.

    The temporary name keeps the target's suffix (``np.save`` and some writers add or check
    suffixes) and names the process, so concurrent writers of one target never share it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any, indent: int | None = 1,
               default: Callable[[Any], Any] | None = None) -> Path:
    return write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False, default=default) + "\n")


def write_jsonl(path: str | os.PathLike, rows: Iterable[Any]) -> Path:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return Path(path)


def under_root(root: str | os.PathLike, path: str | os.PathLike) -> Path | None:
    """``path`` (relative to ``root``, or absolute) resolved, or None when it resolves outside
    ``root``: a user-supplied path never escapes its configured root (symlinks included)."""
    base = Path(root).resolve()
    full = (base / path).resolve()
    return full if full.is_relative_to(base) else None


def sha256_files(paths: Iterable[str | os.PathLike], with_names: bool = False) -> str:
    """One SHA-256 over the bytes of the files in order (and their names, if asked)."""
    h = hashlib.sha256()
    for p in paths:
        if with_names:
            h.update(Path(p).name.encode())
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    return sha256_files([path])


def digest(obj: Any, n: int = 16) -> str:
    """A short stable hash of a JSON-able value (cache keys, run identities)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:n]


def cached_array(cache_dir: str | os.PathLike | None, name: str, key: Any,
                 compute: Callable[[], np.ndarray]) -> np.ndarray:
    """``compute()`` once per ``key``: kept as ``cache_dir/name-<digest(key)>.npy``.

    ``key`` must hold everything the array depends on (model, lengths, inputs). With no
    ``cache_dir`` nothing is cached.
    """
    if cache_dir is None:
        return compute()
    path = Path(cache_dir) / f"{name}-{digest(key)}.npy"
    if path.is_file():
        return np.load(path)
    arr = compute()
    with atomic_path(path) as tmp:
        np.save(tmp, arr)
    return arr
