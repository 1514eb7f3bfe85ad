"""HTTP request bodies, validated before anything runs; limits come from ``ServeConfig``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from canopy_ray.compressor import MODES


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CompressRequest(Request):
    query: str = Field(min_length=1)
    items: list[dict[str, Any]] = Field(min_length=1)
    explain: bool = False
    node_encoder: Literal["tuned", "frozen"] = "tuned"
    branching: int | None = Field(None, ge=2, le=16)
    margin: float | None = Field(None, ge=0, le=1)
    refinement: Literal["canopy", "hybrid"] | None = None  # canopy: Algorithm 1; None: the server's


class AnswerRequest(Request):
    question: str = Field(min_length=1)
    k: int | None = Field(None, ge=1, le=100)
    rounds: int | None = Field(None, ge=1, le=10)
    branching: int | None = Field(None, ge=2, le=16)
    mode: Literal[MODES] | None = None  # type: ignore[valid-type]
    margin: float | None = Field(None, ge=0, le=1)
    explain: bool = False


class ApiError(Exception):
    """An error answer: an HTTP status, a machine-readable reason, a message, optional detail
    fields for the body and ``headers`` (``Retry-After`` on 429/503). ``retryable``: the call
    that raised it may be made again (a replica died under it)."""

    retryable = False

    def __init__(self, status: int, reason: str, message: str, *, headers: dict[str, str] | None = None,
                 **detail):
        super().__init__(message)
        self.status, self.reason, self.message, self.detail = status, reason, message, detail
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"reason": self.reason, "message": self.message, **self.detail}}
