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


class CorruptFileError(CanopyError):
    """A stored file that is torn, truncated, fails its checksum or does not belong with the
    others (an index built for another encoder). ``path`` names the file and ``rebuild`` the
    command that writes it again, so the message says what to run."""

    def __init__(self, path, problem: str, rebuild: str | None = None):
        self.path, self.problem, self.rebuild = str(path), problem, rebuild
        tail = f"; rebuild it with: {rebuild}" if rebuild else ""
        super().__init__(f"{self.path}: {problem}{tail}")

    def with_rebuild(self, rebuild: str) -> "CorruptFileError":
        """The same error with the rebuild command (the layer that knows it adds it)."""
        return type(self)(self.path, self.problem, rebuild)


class IndexMismatchError(CorruptFileError):
    """An index built for another encoder (base model or adapter) than the one loading it."""
