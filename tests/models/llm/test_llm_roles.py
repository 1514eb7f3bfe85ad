"""Roles: prompts, schemas, parsing and graceful degradation, with hand-written model outputs."""

from __future__ import annotations

import asyncio
import json

import pytest

from canopy_ray.models.llm.protocol import ChatResult, LLMHTTPError, LLMTimeoutError
from canopy_ray.models.llm.roles import (CRITIC_SCHEMA, MODALITIES, READER_SCHEMA, ROUTER_SCHEMA, TABLE_SCHEMA,
                                         TABLE_PROMPT_CHARS, Critique, arun_role, check_schema, critic_call,
                                         load_json_object, parse_critic, parse_router, reader_call, resolve,
                                         router_call, run_role, salvage_answer, table_call)

Q = "In which year was Tulsa founded?"
EV = "Tulsa: Tulsa is a city in Oklahoma. It was founded in 1836."


def text_of(messages) -> str:
    parts = []
    for m in messages:
        c = m["content"]
        parts.append(c if isinstance(c, str) else " ".join(p.get("text", "") for p in c))
    return "\n".join(parts)


def done(content: str, finish: str = "stop") -> ChatResult:
    return ChatResult(content, finish, prompt_tokens=10, completion_tokens=5)


# ---------------------------------------------------------------- prompts

@pytest.mark.parametrize("build", [critic_call, reader_call])
def test_critic_and_reader_prompts_hold_question_and_evidence(build):
    call = build(Q, EV)
    assert call.messages[0]["role"] == "system" and call.messages[-1]["role"] == "user"
    user = call.messages[-1]["content"]
    assert Q in user and EV in user
    assert user.index(EV) < user.index(Q)  # question last, next to the answer


def test_empty_evidence_is_named_not_blank():
    assert "(no evidence yet)" in text_of(critic_call(Q, "  ").messages)


def test_table_prompt_holds_question_and_the_table_beginning():
    table = "Sales\nType | 2019\n" + "\n".join(f"row{i} | {i}" for i in range(500))
    user = table_call("How many rows are there?", table).messages[-1]["content"]
    assert "How many rows are there?" in user and "Type | 2019" in user
    assert len(user) < TABLE_PROMPT_CHARS + 100 and user.count("row499") == 0
    assert "Table:" not in table_call("How many?").messages[-1]["content"]


def test_router_prompt_names_only_allowed_modalities():
    call = router_call(Q, ("text", "video"))
    assert Q in text_of(call.messages)
    assert "video (video clips)" in call.messages[0]["content"] and "table" not in call.messages[0]["content"]
    assert call.schema["properties"]["modalities"]["items"]["enum"] == ["text", "video"]
    with pytest.raises(ValueError, match="subset"):
        router_call(Q, ("text", "audio"))
    with pytest.raises(ValueError):
        router_call(Q, ())


def test_images_become_openai_image_parts():
    call = reader_call(Q, EV, images=["data:image/png;base64,AAAA"])
    parts = call.messages[-1]["content"]
    assert parts[0] == {"type": "text", "text": f"Evidence:\n{EV}"}
    assert parts[1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    assert parts[2] == {"type": "text", "text": f"Question: {Q}"}  # the question stays last


# the text-only prompts, byte for byte as they were before pictures existed: a CPU model's
# messages must not change
TEXT_ONLY_EV = "Tower: The Eiffel Tower was built in 1889.\n\nCat: a cat [image media/cat.png]"
TEXT_ONLY = {
    "critic": '[{"role": "system", "content": "You check whether the evidence is enough to answer the question. '
              'Reply in JSON with \\"sufficient\\": true if the evidence states the answer, else false; '
              '\\"missing\\": the fact still needed (\\"\\" if none); \\"next_query\\": a short search '
              'query for that fact (\\"\\" if none)."}, {"role": "user", "content": "Evidence:\\nTower: The '
              'Eiffel Tower was built in 1889.\\n\\nCat: a cat [image media/cat.png]\\n\\nQuestion: Who built '
              'it?"}]',
    "reader": '[{"role": "system", "content": "Answer the question from the evidence. Reply in JSON with '
              '\\"answer\\": a short span of a few words (a name, date, number or yes/no), copied from the '
              'evidence when possible."}, {"role": "user", "content": "Evidence:\\nTower: The Eiffel Tower was '
              'built in 1889.\\n\\nCat: a cat [image media/cat.png]\\n\\nQuestion: Who built it?"}]',
}


@pytest.mark.parametrize("role", ["critic", "reader"])
def test_text_only_messages_are_byte_identical(role):
    make = critic_call if role == "critic" else reader_call
    assert json.dumps(make("Who built it?", TEXT_ONLY_EV).messages) == TEXT_ONLY[role]
    assert json.dumps(make("Who built it?", TEXT_ONLY_EV, images=()).messages) == TEXT_ONLY[role]


def test_pictures_are_labelled_parts_between_evidence_and_question():
    from canopy_ray.models.llm.vision import Picture

    pics = [Picture("Image of i1:", "data:image/png;base64,AAAA"),
            Picture("Frame of v1 at 10 s:", "data:image/jpeg;base64,BBBB")]
    for make in (critic_call, reader_call):
        assert make(Q, EV, images=pics).messages[-1]["content"] == [
            {"type": "text", "text": f"Evidence:\n{EV}"},
            {"type": "text", "text": "Image of i1:"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": "Frame of v1 at 10 s:"},
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,BBBB"}},
            {"type": "text", "text": f"Question: {Q}"}]


# ---------------------------------------------------------------- schemas

@pytest.mark.parametrize("schema", [CRITIC_SCHEMA, READER_SCHEMA, TABLE_SCHEMA, ROUTER_SCHEMA])
def test_schemas_are_openai_strict(schema):
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert schema["required"] == list(schema["properties"])


def test_response_format_is_json_schema_strict():
    rf = critic_call(Q, EV).response_format
    assert rf == {"type": "json_schema", "json_schema": {"name": "canopy_critic", "schema": CRITIC_SCHEMA,
                                                         "strict": True}}


# ---------------------------------------------------------------- parsing good outputs

def test_good_outputs_parse():
    assert resolve(critic_call(Q, EV), done('{"sufficient": false, "missing": "the year", '
                                            '"next_query": "Tulsa founding year"}')).value == \
        Critique(False, "the year", "Tulsa founding year")
    assert resolve(reader_call(Q, EV), done('{"answer": " 1836 "}')).value == "1836"
    assert resolve(table_call(Q), done('{"kind": "aggregation"}')).value == "aggregation"
    out = resolve(router_call(Q), done('{"modalities": ["video", "text", "video"]}'))
    assert out.value == ("text", "video") and not out.failed  # canonical order, repeats merged


def test_fenced_or_wrapped_json_is_accepted():
    assert load_json_object('```json\n{"answer": "x"}\n```') == {"answer": "x"}
    assert load_json_object('Sure! {"answer": "x"} Hope it helps.') == {"answer": "x"}


def test_insufficient_critique_without_query_falls_back_to_the_missing_fact():
    c = parse_critic('{"sufficient": false, "missing": "founding year of Tulsa", "next_query": " "}')
    assert c.next_query == "founding year of Tulsa"


def test_outcome_carries_costs():
    out = resolve(reader_call(Q, EV), done('{"answer": "1836"}'), latency_s=0.5)
    assert (out.prompt_tokens, out.completion_tokens, out.latency_s, out.finish_reason) == (10, 5, 0.5, "stop")
    assert out.content == '{"answer": "1836"}' and out.error is None


# ---------------------------------------------------------------- graceful degradation

CRITIC_BAD = [
    ("not json at all", "invalid_json"),
    ('{"sufficient": "yes", "missing": "", "next_query": ""}', "schema"),
    ('{"sufficient": true, "missing": ""}', "schema"),
    ('{"sufficient": true, "missing": "", "next_query": "", "extra": 1}', "schema"),
    ('["sufficient"]', "schema"),
    ('{"sufficient": false, "missing": "x", "next_query": "' + "q" * 200 + '"}', "schema"),
    ("", "invalid_json"),
]


@pytest.mark.parametrize("content,kind", CRITIC_BAD)
def test_bad_critic_output_counts_as_sufficient(content, kind):
    out = resolve(critic_call(Q, EV), done(content))
    assert out.failed and out.error.startswith(kind + ":")
    assert out.value == Critique(sufficient=True)


def test_cut_off_output_is_reported_as_truncated():
    out = resolve(critic_call(Q, EV), done('{"sufficient": fal', "length"))
    assert out.failed and out.error.startswith("truncated:") and out.value.sufficient


@pytest.mark.parametrize("content", ['{"kind": "count"}', '{"kind": 1}', "lookup please", '{"type": "lookup"}'])
def test_bad_table_output_means_lookup(content):
    out = resolve(table_call(Q), done(content))
    assert out.failed and out.value == "lookup"


@pytest.mark.parametrize("content", ['{"modalities": []}', '{"modalities": ["audio"]}', '{"modalities": "text"}',
                                     "text and video"])
def test_bad_router_output_means_every_modality(content):
    out = resolve(router_call(Q), done(content))
    assert out.failed and out.value == MODALITIES
    restricted = resolve(router_call(Q, ("text", "table")), done('{"modalities": ["video"]}'))
    assert restricted.failed and restricted.value == ("text", "table")


@pytest.mark.parametrize("content,answer", [
    ('{"answer": "Tulsa, Okla', "Tulsa, Okla"),  # cut off mid-string
    ('{"answer": 1836}', ""),  # wrong type: nothing to salvage
    ("1836\nbecause the evidence says so", "1836"),  # an endpoint ignoring response_format
    ('{"reply": "1836"}', ""),
    ("", ""),
])
def test_bad_reader_output_salvages_what_it_can(content, answer):
    out = resolve(reader_call(Q, EV), done(content, "length" if content.endswith("Okla") else "stop"))
    assert out.failed and out.value == answer


def test_salvage_unescapes_and_check_schema_names_the_field():
    assert salvage_answer('{"answer": "say \\"hi\\"') == 'say "hi"'
    with pytest.raises(ValueError, match="next_query"):
        check_schema({"sufficient": True, "missing": "", "next_query": 3}, CRITIC_SCHEMA)
    assert parse_router('{"modalities": ["image"]}') == ("image",)


class FailingClient:
    model = "x"

    def __init__(self, err):
        self.err = err

    def chat(self, messages, *, response_format=None, max_tokens=None):
        raise self.err

    async def achat(self, messages, *, response_format=None, max_tokens=None):
        raise self.err


class EchoClient:
    """Returns fixed content and records what it was asked."""

    model = "x"

    def __init__(self, content):
        self.content, self.calls = content, []

    def chat(self, messages, *, response_format=None, max_tokens=None):
        self.calls.append((messages, response_format, max_tokens))
        return done(self.content)

    async def achat(self, messages, *, response_format=None, max_tokens=None):
        return self.chat(messages, response_format=response_format, max_tokens=max_tokens)


def test_transport_failures_degrade_and_are_labelled():
    out = run_role(FailingClient(LLMTimeoutError("slow")), critic_call(Q, EV))
    assert out.failed and out.error == "timeout: slow" and out.value.sufficient and out.content == ""
    out = asyncio.run(arun_role(FailingClient(LLMHTTPError(503, "busy")), reader_call(Q, EV)))
    assert out.failed and out.error.startswith("http: HTTP 503") and out.value == ""


@pytest.mark.parametrize("err", [ConnectionResetError("reset by peer"), OSError("network unreachable"),
                                 RuntimeError("replica died")])
def test_any_client_exception_degrades_like_a_transport_error(err):
    """A client that raises something other than an LLMError (a raw socket error, a dead Serve
    replica) still degrades: the critic says sufficient, the reader has no answer."""
    out = run_role(FailingClient(err), critic_call(Q, EV))
    assert out.failed and out.value.sufficient and out.error == f"error: {type(err).__name__}: {err}"
    out = asyncio.run(arun_role(FailingClient(err), reader_call(Q, EV)))
    assert out.failed and out.value == "" and out.content == ""


def test_cancellation_is_not_swallowed():
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(arun_role(FailingClient(asyncio.CancelledError()), critic_call(Q, EV)))


@pytest.mark.parametrize("content", ["[" * 100_000 + "]" * 100_000, '{"sufficient": ' * 50_000, None, 42])
def test_replies_no_parser_can_read_degrade(content):
    out = resolve(critic_call(Q, EV), ChatResult(content, "stop"))
    assert out.failed and out.error.startswith("invalid_json") and out.value.sufficient
    assert resolve(reader_call(Q, EV), ChatResult(content, "stop")).value == ""


def test_run_role_sends_schema_and_token_limit():
    client = EchoClient('{"kind": "aggregation"}')
    out = run_role(client, table_call("How many?", max_tokens=9))
    assert out.value == "aggregation" and not out.failed
    messages, rf, max_tokens = client.calls[0]
    assert rf["json_schema"]["schema"] == TABLE_SCHEMA and max_tokens == 9
    assert asyncio.run(arun_role(client, table_call("How many?"))).value == "aggregation"
