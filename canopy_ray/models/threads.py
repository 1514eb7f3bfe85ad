"""Torch's thread count for one block of work."""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch threads (``None``: as they are), then restore the previous count.

    Torch's count is process-wide: a model that set it once at load would set it for every other
    model of the process too (the local LLM's 1 thread slowed the encoders beside it)."""
    import torch

    prev = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(prev)
