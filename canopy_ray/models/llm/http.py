"""A chat-completions client for any OpenAI-compatible endpoint (vLLM, Ray Serve LLM, ours).

``base_url`` includes the API version, as with the OpenAI SDK: ``http://127.0.0.1:8000/v1``;
requests go to ``{base_url}/chat/completions``. Failures raise typed errors from
:mod:`canopy_ray.models.llm.protocol`: :class:`LLMTimeoutError`, :class:`LLMConnectionError`,
:class:`LLMHTTPError` (non-2xx, with the server's error message) and :class:`LLMResponseError`
(a 2xx body that is not a chat completion, or not JSON at all). Nothing else escapes a call:
a refused or reset connection, a protocol error or a read that times out is one of these.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import httpx

from canopy_ray.models.llm.protocol import (ChatResult, LLMConnectionError, LLMHTTPError, LLMResponseError,
                                            LLMTimeoutError, Message, build_request, parse_response)


# every way a request can fail below HTTP: refused, reset, timed out, a broken stream or protocol
_TRANSPORT = (httpx.HTTPError, httpx.StreamError, httpx.InvalidURL, OSError)


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except (ValueError, RecursionError):
        return response.text[:300] or response.reason_phrase
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body))
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        return str(err)[:300]
    return str(body)[:300]


class OpenAIHTTPClient:
    """Sync and async chat completions over HTTP; one connection pool each, reused.

    ``timeout`` bounds the whole request (reading a long generation included);
    ``connect_timeout`` bounds opening the connection.
    """

    def __init__(self, base_url: str, model: str, *, timeout: float = 120.0, connect_timeout: float = 5.0,
                 api_key: str | None = None, headers: dict[str, str] | None = None):
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model = model
        self._timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._client: httpx.Client | None = None
        self._aclient: httpx.AsyncClient | None = None

    def __repr__(self) -> str:
        return f"OpenAIHTTPClient({self.base_url!r}, model={self.model!r})"

    # ---------------------------------------------------------------- shared

    def _body(self, messages, response_format, max_tokens) -> dict:
        return build_request(self.model, messages, response_format=response_format, max_tokens=max_tokens)

    def _result(self, response: httpx.Response, t0: float) -> ChatResult:
        if response.status_code >= 400:
            raise LLMHTTPError(response.status_code, _error_message(response), self.url)
        try:
            body: Any = response.json()
        except (ValueError, RecursionError):
            raise LLMResponseError(f"{self.url} answered {response.status_code} with a body that is not "
                                   f"JSON: {response.text[:120]!r}") from None
        r = parse_response(body)
        return ChatResult(r.content, r.finish_reason, r.prompt_tokens, r.completion_tokens, r.model,
                          time.perf_counter() - t0)

    def _transport_error(self, e: Exception) -> Exception:
        if isinstance(e, httpx.TimeoutException):
            return LLMTimeoutError(f"{self.url}: timed out ({type(e).__name__}, limit {self._timeout.read} s)")
        return LLMConnectionError(f"{self.url}: {type(e).__name__}: {e}")

    # ---------------------------------------------------------------- sync

    def chat(self, messages: Sequence[Message], *, response_format: dict | None = None,
             max_tokens: int | None = None) -> ChatResult:
        if self._client is None:
            self._client = httpx.Client(timeout=self._timeout, headers=self._headers)
        t0 = time.perf_counter()
        try:
            response = self._client.post(self.url, json=self._body(messages, response_format, max_tokens))
        except _TRANSPORT as e:
            raise self._transport_error(e) from None
        return self._result(response, t0)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- async

    async def achat(self, messages: Sequence[Message], *, response_format: dict | None = None,
                    max_tokens: int | None = None) -> ChatResult:
        if self._aclient is None:  # bound to the running event loop on first use
            self._aclient = httpx.AsyncClient(timeout=self._timeout, headers=self._headers)
        t0 = time.perf_counter()
        try:
            response = await self._aclient.post(self.url, json=self._body(messages, response_format, max_tokens))
        except _TRANSPORT as e:
            raise self._transport_error(e) from None
        return self._result(response, t0)

    async def aclose(self) -> None:
        if self._aclient is not None:
            await self._aclient.aclose()
            self._aclient = None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
