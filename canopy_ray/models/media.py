"""Optional media decoders, imported where they are used.

``decord`` (video frames) has wheels for x86-64 only (Linux, macOS on Intel, Windows), so it is
a dependency there and the ``video`` extra names it; elsewhere (Apple Silicon, Linux aarch64)
the package installs without it and video items fail with :class:`MissingExtraError`.
"""

from __future__ import annotations

VIDEO_HINT = 'pip install "canopy-ray[video]"'


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message says which extra brings it."""


def import_decord():
    """The ``decord`` module, or :class:`MissingExtraError` naming the ``video`` extra."""
    try:
        import decord
    except ImportError as e:
        raise MissingExtraError(
            f"video items need decord, which is not installed ({e}); install it with {VIDEO_HINT} "
            "(decord publishes wheels for x86-64 only: on Apple Silicon or Linux aarch64, build it from "
            "source or leave video items out of the corpus)") from None
    return decord


def decord_frames(path, times):
    """RGB frames (T, H, W, 3) uint8 at ``times`` seconds (the nearest frame at the video's
    average rate), decoded with decord (:class:`MissingExtraError` without it)."""
    decord = import_decord()
    vr = decord.VideoReader(str(path), ctx=decord.cpu(0))
    fps, last = float(vr.get_avg_fps()) or 25.0, len(vr) - 1
    return vr.get_batch([min(last, max(0, int(round(t * fps)))) for t in times]).asnumpy()
