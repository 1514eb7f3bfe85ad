"""HTTP request bodies, validated before anything runs; limits come from ``ServeConfig``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from canopy_ray.core.policy import Policy


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Compressing(Request):
    # what is scored and kept, in the config's text form ("canopy margin=0.05"); None: the server's
    policy: Policy | None = None

    @field_validator("policy", mode="before")
    @classmethod
    def _policy(cls, v):
        if v is None or isinstance(v, Policy):
            return v
        if not isinstance(v, str):
            raise ValueError("policy must be a string such as 'canopy margin=0.05'")
        policy = Policy.parse(v)
        if policy.margin is None:
            raise ValueError("a request's policy names its margin (auto is the server's config alone)")
        return policy


class CompressRequest(Compressing):
    query: str = Field(min_length=1)
    items: list[dict[str, Any]] = Field(min_length=1)
    explain: bool = False
    node_encoder: Literal["tuned", "frozen"] = "tuned"
    branching: int | None = Field(None, ge=2, le=16)


class AnswerRequest(Compressing):
    question: str = Field(min_length=1)
    k: int | None = Field(None, ge=1, le=100)
    rounds: int | None = Field(None, ge=1, le=10)
    branching: int | None = Field(None, ge=2, le=16)
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
