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


class AnswerRequest(Request):
    question: str = Field(min_length=1)
    k: int | None = Field(None, ge=1, le=100)
    rounds: int | None = Field(None, ge=1, le=10)
    branching: int | None = Field(None, ge=2, le=16)
    mode: Literal[MODES] | None = None  # type: ignore[valid-type]
    explain: bool = False


class ApiError(Exception):
    """A client error with an HTTP status and a machine-readable reason."""

    def __init__(self, status: int, reason: str, message: str, **detail):
        super().__init__(message)
        self.status, self.reason, self.message, self.detail = status, reason, message, detail

    def body(self) -> dict:
        return {"error": {"reason": self.reason, "message": self.message, **self.detail}}
