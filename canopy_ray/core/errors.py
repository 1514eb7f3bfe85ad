"""Typed errors raised by the pure core.

A job catches :class:`ItemError`, counts it under ``reason`` and moves on, so every
message names what was wrong in words a user can act on.
"""


class CanopyError(ValueError):
    """Base class for input errors detected by canopy_ray."""


class ItemError(CanopyError):
    """A corpus item or question that does not match the canonical form."""

    def __init__(self, reason: str, message: str, item_id: str | None = None):
        self.reason = reason
        self.item_id = item_id
        prefix = f"item {item_id!r}: " if item_id else ""
        super().__init__(f"{prefix}{message}")
