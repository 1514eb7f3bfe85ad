"""Pixels for a multimodal critic and reader: kept images and video frames as data URIs.

A kept image node is its image file; a kept video node is its frames at the node's frame times
(``Piece.media``: one per ``hierarchy.frame_every_s``, at most ``max_frames``), decoded with
decord when it is installed, else with the ``ffmpeg`` command. Each becomes a
:class:`Picture`: a label that names the item (and the frame's time) and a ``data:`` URI that
:mod:`.roles` sends as an OpenAI ``image_url`` part.

Files are read only under ``serve.media_root``: a path that resolves outside it, a missing or
undecodable file, or no media root at all is skipped and counted by reason, never an error of
the question. ``budget`` (``llm.max_images``) bounds images plus frames per prompt, newest
evidence first, as the reader's token cap does.
"""

from __future__ import annotations

import base64
import io
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from canopy_ray.core.evidence import Piece
from canopy_ray.core.files import under_root

IMAGE_MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


@dataclass(frozen=True)
class Picture:
    """One image part: ``label`` (text shown before it) and ``url`` (a data URI)."""

    label: str
    url: str


class MediaError(ValueError):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def media_path(path: str, root: str | Path | None) -> Path:
    """``path`` (relative to ``root``, or absolute) resolved, refused unless it lies under ``root``."""
    if not root:
        raise MediaError("no_media_root", "serve.media_root is not set: no media file may be read")
    full = under_root(root, path)
    if full is None:
        raise MediaError("path_outside_media_root", f"{path!r} resolves outside the media root")
    if not full.is_file():
        raise MediaError("missing_file", f"{path!r} is not a file under the media root")
    return full


def image_data_uri(path: Path) -> str:
    """The file's bytes as a data URI when it is a PNG/JPEG/WebP/GIF (checked by decoding), else
    its pixels re-encoded as PNG."""
    from PIL import Image, UnidentifiedImageError

    raw = path.read_bytes()
    try:
        with Image.open(io.BytesIO(raw)) as im:
            fmt = im.format
            im.load()
            if fmt not in IMAGE_MIME:
                return _png_uri(np.asarray(im.convert("RGB")))
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise MediaError("bad_image", f"{path.name}: {e}") from None
    return f"data:{IMAGE_MIME[fmt]};base64,{base64.b64encode(raw).decode()}"


def _png_uri(rgb: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return f"data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}"


def _jpeg_uri(rgb: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=90, subsampling=0)  # 4:4:4: sharp colour edges
    return f"data:image/jpeg;base64,{base64.b64encode(buf.getvalue()).decode()}"


def read_frames(path: Path, times: Sequence[float]) -> list[np.ndarray]:
    """RGB frames (H, W, 3) uint8 at ``times`` seconds: decord if installed, else ``ffmpeg``."""
    from canopy_ray.models.media import MissingExtraError, decord_frames

    try:
        return list(decord_frames(path, times))
    except MissingExtraError:
        return [_ffmpeg_frame(path, t) for t in times]


def _ffmpeg_frame(path: Path, t: float) -> np.ndarray:
    from PIL import Image

    exe = shutil.which("ffmpeg")
    if exe is None:
        raise MediaError("no_decoder", "video frames need decord or the ffmpeg command; neither is installed")
    out = subprocess.run([exe, "-v", "error", "-ss", f"{t:.3f}", "-i", str(path), "-frames:v", "1",
                          "-f", "image2pipe", "-vcodec", "png", "-"], capture_output=True, timeout=60)
    if out.returncode or not out.stdout:
        raise MediaError("bad_video", f"{path.name} at {t} s: {out.stderr.decode(errors='replace')[:200]}")
    with Image.open(io.BytesIO(out.stdout)) as im:
        return np.asarray(im.convert("RGB"))


def _fmt_s(t: float) -> str:
    return f"{t:g}"


def evidence_pictures(pieces: Sequence[Piece], root: str | Path | None, budget: int,
                      cache: dict | None = None) -> tuple[list[Picture], Counter]:
    """The pictures of the evidence's kept images and video frames, at most ``budget``, and what
    was skipped (by reason). The newest pieces go first, as under the reader's token cap (a
    video cut short keeps its first frames); media that cannot be read take no budget. The
    pictures come back in evidence order. ``cache`` (per question) keeps decoded media between
    the critic and the reader."""
    cache = {} if cache is None else cache
    chosen: list[list[Picture]] = []
    skipped: Counter = Counter()
    left = budget
    for p in reversed(pieces):
        if left <= 0:
            break
        if p.media:
            got = _piece_pictures(p, root, left, cache, skipped)
            chosen.append(got)
            left -= len(got)
    return [pic for got in reversed(chosen) for pic in got], skipped


def _piece_pictures(p: Piece, root, left: int, cache: dict, skipped: Counter) -> list[Picture]:
    pictures: list[Picture] = []
    videos: dict[str, list[float]] = {}
    for path, t in p.media:
        if t is None:
            if len(pictures) < left:
                if (path, None) not in cache:
                    cache[(path, None)] = _load(lambda: image_data_uri(media_path(path, root)))
                _add(pictures, skipped, cache[(path, None)], f"Image of {p.item_id}:")
        else:
            videos.setdefault(path, []).append(float(t))
    for path, times in videos.items():
        times = times[:max(0, left - len(pictures))]
        todo = [t for t in times if (path, t) not in cache]
        if todo:
            frames = _load(lambda: read_frames(media_path(path, root), todo))
            for i, t in enumerate(todo):
                cache[(path, t)] = frames if isinstance(frames, MediaError) else _jpeg_uri(frames[i])
        for t in times:
            _add(pictures, skipped, cache[(path, t)], f"Frame of {p.item_id} at {_fmt_s(t)} s:")
    return pictures


def _load(read):
    try:
        return read()
    except MediaError as e:
        return e
    except Exception as e:  # a decoder that cannot read this file: skipped, like any bad media
        return MediaError("bad_media", f"{type(e).__name__}: {e}")


def _add(pictures: list[Picture], skipped: Counter, got, label: str) -> None:
    if isinstance(got, MediaError):
        skipped[got.reason] += 1
    else:
        pictures.append(Picture(label, got))
