"""A stand-in OpenAI-compatible chat server on 127.0.0.1 for tests of the HTTP LLM clients:
real sockets and real JSON, replies chosen by the test's ``reply(request) -> content``."""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator


def completion(model: str, content: str) -> dict:
    """A non-streaming chat completion body."""
    return {"id": "x", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5}}


class JSONHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send_json(self, body: dict, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def read_json(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """The handler served on a free loopback port; yields the base URL ending in ``/v1``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def chat_handler(reply: Callable[[dict], str], calls: list, model: str = "served-model") -> type[JSONHandler]:
    """A handler answering ``GET /v1/models`` (one ``model``) and chat completions
    (``reply(request)`` gives the content), recording ``(path, request)`` in ``calls``."""

    class Handler(JSONHandler):
        def do_GET(self):
            if self.path == "/v1/models":
                self.send_json({"object": "list", "data": [{"id": model, "object": "model"}]})
            else:
                self.send_json({"error": {"message": "not found"}}, 404)

        def do_POST(self):
            req = self.read_json()
            calls.append((self.path, req))
            self.send_json(completion(req["model"], reply(req)))

    return Handler
