"""The OpenAI chat-completions protocol every LLM backend speaks, and its typed errors.

A request is the plain dict an OpenAI client sends to ``POST /v1/chat/completions``; outputs
are constrained with ``response_format={"type": "json_schema", "json_schema": {"name", "schema",
"strict": true}}``. This module is pure (no torch, no httpx): building requests, validating
them on the server side (:func:`validate_request`), reading responses (:func:`parse_response`)
and mapping errors to HTTP (:func:`error_body`).

Errors: every failure a caller may want to count is an :class:`LLMError`. Server-side request
problems are :class:`LLMRequestError` and carry the HTTP status to answer with (400, 404);
client-side transport problems are :class:`LLMTimeoutError`, :class:`LLMConnectionError`,
:class:`LLMHTTPError` (non-2xx answer) and :class:`LLMResponseError` (malformed body).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, Sequence

Message = dict[str, Any]  # {"role": "system"|"developer"|"user"|"assistant", "content": str | [parts]}
ROLES = ("system", "developer", "user", "assistant")  # "developer" (OpenAI's newer name) is read as "system"
MAX_STOP = 4  # OpenAI's limit on stop sequences


class LLMError(Exception):
    """Base class of every LLM failure; ``kind`` is a short label for counting."""

    kind = "llm_error"


class LLMRequestError(LLMError):
    """A chat-completions request the server rejects; ``status`` is the HTTP status to send."""

    kind = "bad_request"

    def __init__(self, message: str, *, status: int = 400, code: str = "invalid_request",
                 param: str | None = None):
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


class LLMTimeoutError(LLMError):
    kind = "timeout"


class LLMConnectionError(LLMError):
    kind = "connection"


class LLMHTTPError(LLMError):
    """The endpoint answered with a non-2xx status."""

    kind = "http"

    def __init__(self, status: int, message: str, url: str = ""):
        super().__init__(f"HTTP {status} from {url or 'the LLM endpoint'}: {message}")
        self.status, self.message, self.url = status, message, url


class LLMResponseError(LLMError):
    """A 2xx answer whose body is not a chat completion."""

    kind = "bad_response"


@dataclass(frozen=True)
class ChatResult:
    """What a client returns for one completion."""

    content: str
    finish_reason: str  # "stop" | "length" | whatever the endpoint reports
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model: str = ""
    latency_s: float = 0.0


class ChatClient(Protocol):
    """One model behind the chat-completions protocol (HTTP or in-process)."""

    model: str

    def chat(self, messages: Sequence[Message], *, response_format: dict | None = None,
             max_tokens: int | None = None) -> ChatResult: ...

    async def achat(self, messages: Sequence[Message], *, response_format: dict | None = None,
                    max_tokens: int | None = None) -> ChatResult: ...


def json_schema_format(name: str, schema: dict, strict: bool = True) -> dict:
    """The ``response_format`` constraining the output to ``schema``."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}}


def build_request(model: str, messages: Sequence[Message], *, response_format: dict | None = None,
                  max_tokens: int | None = None) -> dict:
    """A greedy (temperature 0) chat-completions request body."""
    body: dict[str, Any] = {"model": model, "messages": list(messages), "temperature": 0.0}
    if max_tokens is not None:
        body["max_tokens"] = int(max_tokens)
    if response_format is not None:
        body["response_format"] = response_format
    return body


def parse_response(body: Any) -> ChatResult:
    """Read ``choices[0].message.content``, ``finish_reason`` and ``usage`` from a response."""
    try:
        choice = body["choices"][0]
        content = choice["message"].get("content")
        finish = choice.get("finish_reason") or "stop"
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise LLMResponseError(f"not a chat completion (no choices[0].message): {e!r}") from None
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise LLMResponseError(f"choices[0].message.content is {type(content).__name__}, not a string")
    usage = body.get("usage") or {}
    try:
        prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    except (TypeError, ValueError):
        prompt = completion = 0
    return ChatResult(content, str(finish), prompt, completion, str(body.get("model") or ""))


def error_body(err: LLMRequestError) -> dict:
    """The OpenAI error object for an HTTP error response: ``{"error": {...}}``."""
    return {"error": {"message": str(err), "type": "invalid_request_error" if err.status < 500
                      else "server_error", "param": err.param, "code": err.code}}


# ---------------------------------------------------------------- server-side validation

@dataclass(frozen=True)
class ChatRequest:
    """A validated request: text messages, a token limit, an output constraint, stop strings
    and how to deliver the reply (``stream``: server-sent chunks; ``include_usage``: a final
    usage chunk). ``seed`` is kept for backends that sample; greedy ones ignore it."""

    model: str | None
    messages: tuple[dict[str, str], ...]  # content flattened to text; "developer" read as "system"
    max_tokens: int | None
    format: Literal["text", "json_object", "json_schema"]
    schema: dict | None = None
    schema_name: str | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    seed: int | None = None


def _bad(message: str, param: str | None = None, code: str = "invalid_request") -> LLMRequestError:
    return LLMRequestError(message, param=param, code=code)


def _text_content(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or "type" not in part:
                raise _bad(f"messages[{i}].content[{j}] must be an object with a 'type'",
                           f"messages[{i}].content")
            if part["type"] != "text":
                raise _bad(f"messages[{i}].content[{j}] has type {part['type']!r}; this model reads "
                           "text only", f"messages[{i}].content", "unsupported_content")
            if not isinstance(part.get("text"), str):
                raise _bad(f"messages[{i}].content[{j}].text must be a string", f"messages[{i}].content")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"messages[{i}].content must be a string or a list of text parts",
               f"messages[{i}].content")


def _positive_int(request: dict, key: str) -> int | None:
    value = request.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(f"{key} must be a positive integer, got {value!r}", key)
    return value


def _stop(request: dict) -> tuple[str, ...]:
    value = request.get("stop")
    stops = [value] if isinstance(value, str) else value
    if stops is None:
        return ()
    if not isinstance(stops, list) or len(stops) > MAX_STOP or \
            not all(isinstance(s, str) and s for s in stops):
        raise _bad(f"stop must be a non-empty string or a list of at most {MAX_STOP} of them", "stop")
    return tuple(stops)


def _stream(request: dict) -> tuple[bool, bool]:
    stream, options = request.get("stream"), request.get("stream_options")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream must be a boolean", "stream")
    if options is None:
        return bool(stream), False
    if not stream:
        raise _bad("stream_options is only allowed when stream is true", "stream_options")
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise _bad("stream_options must be an object with a boolean include_usage", "stream_options")
    return True, options.get("include_usage", False)


def validate_request(request: Any) -> ChatRequest:
    """Check a chat-completions body; raise :class:`LLMRequestError` (HTTP 400) naming the field.

    Accepted: ``model``, ``messages`` (system/developer/user/assistant, string or text-part
    content; ``developer`` is read as ``system``), ``max_tokens`` or ``max_completion_tokens``,
    ``response_format`` (text, json_object, json_schema), ``stop`` (a string or up to 4),
    ``stream`` and ``stream_options.include_usage``, ``n`` = 1. Sampling fields (``temperature``,
    ``top_p``, ``seed``: an integer) are checked and kept; greedy backends ignore them. Other
    unknown fields are ignored, as vLLM does.
    """
    if not isinstance(request, dict):
        raise _bad(f"the request body must be a JSON object, got {type(request).__name__}")
    model = request.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model must be a string", "model")
    raw = request.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad("messages must be a non-empty list", "messages")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}] must be an object", "messages")
        if m.get("role") not in ROLES:
            raise _bad(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {m.get('role')!r}",
                       f"messages[{i}].role")
        role = "system" if m["role"] == "developer" else m["role"]
        messages.append({"role": role, "content": _text_content(m.get("content"), i)})
    n = request.get("n", 1)
    if n not in (None, 1):
        raise _bad(f"n must be 1, got {n!r}", "n", "unsupported_parameter")
    for key in ("tools", "functions"):
        if request.get(key):
            raise _bad(f"{key} are not supported", key, "unsupported_parameter")
    for key in ("temperature", "top_p"):
        value = request.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise _bad(f"{key} must be a number", key)
    seed = request.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise _bad("seed must be an integer", "seed")
    max_tokens = _positive_int(request, "max_completion_tokens") or _positive_int(request, "max_tokens")
    stream, include_usage = _stream(request)
    common = dict(model=model, messages=tuple(messages), max_tokens=max_tokens, stop=_stop(request),
                  stream=stream, include_usage=include_usage, seed=seed)

    rf = request.get("response_format")
    if rf is None:
        return ChatRequest(format="text", **common)
    if not isinstance(rf, dict) or rf.get("type") not in ("text", "json_object", "json_schema"):
        raise _bad("response_format.type must be 'text', 'json_object' or 'json_schema'", "response_format")
    if rf["type"] != "json_schema":
        return ChatRequest(format=rf["type"], **common)
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise _bad("response_format.json_schema must be an object", "response_format.json_schema")
    name = js.get("name")
    if not isinstance(name, str) or not name:
        raise _bad("response_format.json_schema.name must be a non-empty string",
                   "response_format.json_schema.name")
    schema = js.get("schema")
    if not isinstance(schema, dict):
        raise _bad("response_format.json_schema.schema must be a JSON schema object",
                   "response_format.json_schema.schema")
    try:
        import jsonschema

        jsonschema.validators.validator_for(schema).check_schema(schema)
    except ImportError:  # pragma: no cover - jsonschema ships with ray
        pass
    except jsonschema.SchemaError as e:
        raise _bad(f"response_format.json_schema.schema is not a valid JSON schema: {e.message}",
                   "response_format.json_schema.schema", "invalid_schema") from None
    return ChatRequest(format="json_schema", schema=schema, schema_name=name, **common)
