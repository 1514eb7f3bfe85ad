"""The four LLM roles of CANOPY: prompts, JSON schemas, parsing, graceful degradation.

Each role is built as a :class:`RoleCall` (chat messages, the output's JSON schema, a token
limit, a parser and a fallback value) by :func:`critic_call`, :func:`reader_call`,
:func:`table_call` and :func:`router_call`, and run against any :class:`ChatClient` with
:func:`run_role` / :func:`arun_role`. The result is an :class:`Outcome` that always carries a
usable value: when the call fails (transport error, unparseable or schema-violating output)
the value degrades and ``outcome.failed`` is true, so the pipeline counts it and goes on:

- critic -> sufficient (stop searching, read what we have);
- reader -> an answer salvaged from the raw output if there is one, else "";
- table classifier -> "lookup" (the table is refined like any other item);
- modality router -> every allowed modality.

Prompts are short and put the question last, next to the answer, which suits small models
(SmolLM2-135M); schemas bound every string (``maxLength``) so that under constrained decoding
each role's default ``max_tokens`` normally suffices; an output cut off by the limit is counted
as ``truncated`` and degrades like any other failure.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Sequence, TypeVar

from canopy_ray.models.llm.protocol import ChatClient, ChatResult, LLMError, Message, json_schema_format

T = TypeVar("T")
log = logging.getLogger(__name__)
MODALITIES = ("text", "table", "image", "video")
TABLE_KINDS = ("aggregation", "lookup")
NO_EVIDENCE = "(no evidence yet)"
TABLE_PROMPT_CHARS = 1500  # the classifier sees the table's beginning (title, header, first rows)


class RoleOutputError(ValueError):
    """A model output that is not the role's JSON; ``kind`` labels it for counting."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Critique:
    sufficient: bool
    missing: str = ""
    next_query: str = ""


# ---------------------------------------------------------------- schemas (OpenAI strict mode:
# every property required, no additional properties)

def _object(properties: dict) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}


CRITIC_SCHEMA = _object({
    "sufficient": {"type": "boolean"},
    "missing": {"type": "string", "maxLength": 120},
    "next_query": {"type": "string", "maxLength": 120},
})
READER_SCHEMA = _object({"answer": {"type": "string", "maxLength": 100}})
TABLE_SCHEMA = _object({"kind": {"type": "string", "enum": list(TABLE_KINDS)}})


def router_schema(modalities: Sequence[str] = MODALITIES) -> dict:
    return _object({"modalities": {"type": "array", "items": {"type": "string", "enum": list(modalities)},
                                   "minItems": 1, "maxItems": len(modalities)}})


ROUTER_SCHEMA = router_schema()

# ---------------------------------------------------------------- prompts

CRITIC_SYSTEM = (
    "You check whether the evidence is enough to answer the question. Reply in JSON with "
    '"sufficient": true if the evidence states the answer, else false; "missing": the fact '
    'still needed ("" if none); "next_query": a short search query for that fact ("" if none).'
)
READER_SYSTEM = (
    "Answer the question from the evidence. Reply in JSON with \"answer\": a short span of a few "
    "words (a name, date, number or yes/no), copied from the evidence when possible."
)
TABLE_SYSTEM = (
    "Classify the question asked about the table. \"aggregation\": it needs many rows (count, "
    "sum, average, maximum, minimum, list all, compare). \"lookup\": it needs one or a few rows. "
    'Reply in JSON with "kind".'
)
ROUTER_SYSTEM = (
    "Choose the sources that may hold the answer to the question: {choices}. "
    'Reply in JSON with "modalities": a list of one or more of them.'
)
MODALITY_WORDS = {"text": "text (passages)", "table": "table (tables)", "image": "image (pictures)",
                  "video": "video (video clips)"}


def _user(*blocks: str) -> str:
    return "\n\n".join(blocks)


def _content(evidence: str, question: str, images: Sequence) -> str | list[dict]:
    """The user turn: evidence then question as one string (text-only models: unchanged), or,
    with images, OpenAI content parts for a vision model: the evidence text, each picture after
    its label (an item id, a frame's time), then the question, last as in the text prompt.
    ``images`` holds :class:`~canopy_ray.models.llm.vision.Picture` s or plain URLs."""
    if not images:
        return _user(evidence, question)
    parts: list[dict] = [{"type": "text", "text": evidence}]
    for im in images:
        label, url = (None, im) if isinstance(im, str) else (im.label, im.url)
        if label:
            parts.append({"type": "text", "text": label})
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts + [{"type": "text", "text": question}]


def critic_messages(question: str, evidence: str, images: Sequence = ()) -> list[Message]:
    user = _content(f"Evidence:\n{evidence.strip() or NO_EVIDENCE}", f"Question: {question.strip()}", images)
    return [{"role": "system", "content": CRITIC_SYSTEM}, {"role": "user", "content": user}]


def reader_messages(question: str, evidence: str, images: Sequence = ()) -> list[Message]:
    user = _content(f"Evidence:\n{evidence.strip() or NO_EVIDENCE}", f"Question: {question.strip()}", images)
    return [{"role": "system", "content": READER_SYSTEM}, {"role": "user", "content": user}]


def table_messages(question: str, table: str = "") -> list[Message]:
    table = table.strip()
    if len(table) > TABLE_PROMPT_CHARS:
        table = table[:TABLE_PROMPT_CHARS].rsplit("\n", 1)[0] + "\n..."
    blocks = ([f"Table:\n{table}"] if table else []) + [f"Question: {question.strip()}"]
    return [{"role": "system", "content": TABLE_SYSTEM}, {"role": "user", "content": _user(*blocks)}]


def router_messages(question: str, modalities: Sequence[str] = MODALITIES) -> list[Message]:
    choices = ", ".join(MODALITY_WORDS[m] for m in modalities)
    return [{"role": "system", "content": ROUTER_SYSTEM.format(choices=choices)},
            {"role": "user", "content": f"Question: {question.strip()}"}]


# ---------------------------------------------------------------- parsing

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


def load_json_object(text: str) -> dict:
    """The JSON object in a model's output (code fences and surrounding prose tolerated)."""
    s = text.strip()
    m = _FENCE.match(s)
    if m:
        s = m.group(1)
    try:
        value = json.loads(s)
    except json.JSONDecodeError:
        start, end = s.find("{"), s.rfind("}")
        if start < 0 or end <= start:
            raise RoleOutputError("invalid_json", f"no JSON object in {text[:80]!r}") from None
        try:
            value = json.loads(s[start:end + 1])
        except json.JSONDecodeError as e:
            raise RoleOutputError("invalid_json", f"invalid JSON ({e.msg}) in {text[:80]!r}") from None
    if not isinstance(value, dict):
        raise RoleOutputError("schema", f"expected a JSON object, got {type(value).__name__}")
    return value


def check_schema(value: Any, schema: dict) -> None:
    """Validate against a role schema; :class:`RoleOutputError` names the first violation."""
    import jsonschema

    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(value), key=lambda e: e.path)
    if errors:
        e = errors[0]
        where = "/".join(map(str, e.absolute_path)) or "(root)"
        raise RoleOutputError("schema", f"{where}: {e.message}")


def parse_critic(text: str) -> Critique:
    v = load_json_object(text)
    check_schema(v, CRITIC_SCHEMA)
    missing, query = v["missing"].strip(), v["next_query"].strip()
    if not v["sufficient"] and not query:
        query = missing  # a follow-up query is needed; the missing fact is the best we have
    return Critique(v["sufficient"], missing, query)


def parse_reader(text: str) -> str:
    v = load_json_object(text)
    check_schema(v, READER_SCHEMA)
    return v["answer"].strip()


def parse_table(text: str) -> str:
    v = load_json_object(text)
    check_schema(v, TABLE_SCHEMA)
    return v["kind"]


def parse_router(text: str, modalities: Sequence[str] = MODALITIES) -> tuple[str, ...]:
    v = load_json_object(text)
    check_schema(v, router_schema(modalities))
    chosen = set(v["modalities"])  # repeats are harmless (grammars cannot forbid them)
    return tuple(m for m in modalities if m in chosen)  # canonical order


_PARTIAL_ANSWER = re.compile(r'"answer"\s*:\s*"((?:[^"\\]|\\.)*)')


def salvage_answer(text: str) -> str:
    """A reader fallback: the (possibly cut-off) answer string, or plain text that is not JSON."""
    m = _PARTIAL_ANSWER.search(text)
    if m:
        try:
            return json.loads(f'"{m.group(1)}"').strip()
        except json.JSONDecodeError:
            return m.group(1).strip()
    s = text.strip()
    if not s or s.startswith(("{", "[", "```")):
        return ""
    return " ".join(s.splitlines()[0].split()[:20])


# ---------------------------------------------------------------- calls and outcomes

@dataclass(frozen=True)
class RoleCall(Generic[T]):
    """Everything needed to ask one role once, independent of the backend."""

    role: str  # "critic" | "reader" | "table" | "router"
    messages: list[Message]
    schema: dict
    max_tokens: int
    parse: Callable[[str], T]
    fallback: T
    salvage: Callable[[str], T] | None = None  # fallback computed from the raw output

    @property
    def response_format(self) -> dict:
        return json_schema_format(f"canopy_{self.role}", self.schema)


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """A role's value (degraded if ``failed``), with what it cost."""

    role: str
    value: T
    failed: bool = False
    error: str | None = None  # "<kind>: <detail>" when failed
    content: str = ""  # the raw model output ("" when no answer came back)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    finish_reason: str = ""
    extra: dict = field(default_factory=dict)


def critic_call(question: str, evidence: str, *, images: Sequence = (),
                max_tokens: int = 96) -> RoleCall[Critique]:
    return RoleCall("critic", critic_messages(question, evidence, images), CRITIC_SCHEMA, max_tokens,
                    parse_critic, Critique(sufficient=True))


def reader_call(question: str, evidence: str, *, images: Sequence = (),
                max_tokens: int = 48) -> RoleCall[str]:
    return RoleCall("reader", reader_messages(question, evidence, images), READER_SCHEMA, max_tokens,
                    parse_reader, "", salvage_answer)


def table_call(question: str, table: str = "", *, max_tokens: int = 16) -> RoleCall[str]:
    return RoleCall("table", table_messages(question, table), TABLE_SCHEMA, max_tokens, parse_table, "lookup")


def router_call(question: str, modalities: Sequence[str] = MODALITIES, *,
                max_tokens: int = 32) -> RoleCall[tuple[str, ...]]:
    modalities = tuple(modalities)
    unknown = [m for m in modalities if m not in MODALITIES]
    if not modalities or unknown:
        raise ValueError(f"modalities must be a non-empty subset of {MODALITIES}, got {modalities}")
    return RoleCall("router", router_messages(question, modalities), router_schema(modalities), max_tokens,
                    lambda text: parse_router(text, modalities), modalities)


def resolve(call: RoleCall[T], result: ChatResult, latency_s: float = 0.0) -> Outcome[T]:
    """Parse a completion into the role's value, degrading on any parse or schema failure
    (a reply that is not a string, or JSON nested past the parser's depth, included)."""
    content = result.content if isinstance(result.content, str) else ""
    cost = dict(content=content, prompt_tokens=result.prompt_tokens,
                completion_tokens=result.completion_tokens, latency_s=latency_s,
                finish_reason=result.finish_reason)
    try:
        if not isinstance(result.content, str):
            raise RoleOutputError("invalid_json", f"the reply is {type(result.content).__name__}, not text")
        return Outcome(call.role, call.parse(content), **cost)
    except (RoleOutputError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
        kind = e.kind if isinstance(e, RoleOutputError) else "invalid_json"
        kind = "truncated" if result.finish_reason == "length" else kind
        try:
            value = call.salvage(content) if call.salvage else call.fallback
        except Exception:  # a salvage that cannot read this reply
            value = call.fallback
        return Outcome(call.role, value, True, f"{kind}: {e}", **cost)


def _failed(call: RoleCall[T], err: Exception, latency_s: float) -> Outcome[T]:
    if isinstance(err, LLMError):
        return Outcome(call.role, call.fallback, True, f"{err.kind}: {err}", latency_s=latency_s)
    # not a typed LLM error (a client that raised something else: a socket error, a dead
    # replica): still the backend's failure, so it degrades the same way, and is logged
    log.warning("%s call failed with %s", call.role, type(err).__name__, exc_info=err)
    return Outcome(call.role, call.fallback, True, f"error: {type(err).__name__}: {err}", latency_s=latency_s)


def run_role(client: ChatClient, call: RoleCall[T]) -> Outcome[T]:
    """Ask ``client`` once; never raises for LLM failures (see the module docstring): a
    transport error (refused, reset, timed out), an error status, a body that is not a chat
    completion and an output that does not parse all give the role's degraded value."""
    t0 = time.perf_counter()
    try:
        result = client.chat(call.messages, response_format=call.response_format, max_tokens=call.max_tokens)
    except Exception as e:
        return _failed(call, e, time.perf_counter() - t0)
    return resolve(call, result, time.perf_counter() - t0)


async def arun_role(client: ChatClient, call: RoleCall[T]) -> Outcome[T]:
    """:func:`run_role` for async callers (Serve deployments); cancellation still propagates."""
    t0 = time.perf_counter()
    try:
        result = await client.achat(call.messages, response_format=call.response_format,
                                    max_tokens=call.max_tokens)
    except Exception as e:
        return _failed(call, e, time.perf_counter() - t0)
    return resolve(call, result, time.perf_counter() - t0)
