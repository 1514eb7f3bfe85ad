"""``--llm-url`` on ``canopy eval`` and ``canopy sweep``: reader and critic go to an
OpenAI-compatible server (a real HTTP server on 127.0.0.1 answering like the scripted client)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.eval.conftest import CORPUS, QUESTIONS
from tests.eval.scripted import ScriptedClient


class _Server(BaseHTTPRequestHandler):
    calls: list = []

    def log_message(self, *args):
        pass

    def _send(self, body: dict):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({"object": "list", "data": [{"id": "served-model", "object": "model"}]})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append((self.path, req["model"], req["response_format"]["json_schema"]["name"]))
        content = ScriptedClient()._reply(req["messages"], req["response_format"])
        self._send({"id": "x", "object": "chat.completion", "model": req["model"],
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5}})


@pytest.fixture
def served():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Server.calls = []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.mark.integration
def test_eval_sends_reader_and_critic_to_the_llm_url(served, tmp_path):
    from canopy_ray.cli import main

    rc = main(["eval", "--questions", str(QUESTIONS), "--corpus", str(CORPUS), "--method", "canopy,random",
               "--n", "2", "--llm-url", served, "--out", str(tmp_path / "ev")])
    assert rc == 0
    roles = {name for _, _, name in _Server.calls}
    assert {"canopy_reader", "canopy_critic"} <= roles
    assert {(path, model) for path, model, _ in _Server.calls} == {("/v1/chat/completions", "served-model")}
    for method in ("canopy", "random"):
        run = json.loads((tmp_path / "ev" / f"eval_{method}.json").read_text())
        assert run["spec"]["llm_model"] == "served-model" and run["errors"] == 0
        assert all(r["prediction"] in ("Tulsa", "Arkansas River", "Somerset", "unknown") for r in run["records"])


def test_llm_model_without_llm_url_is_a_usage_error(capsys):
    from canopy_ray.eval.sweep import main as sweep_main
    from canopy_ray.evaluator import main as eval_main

    assert eval_main(["--questions", str(QUESTIONS), "--llm-model", "m", "--out", "x"]) == 2
    assert sweep_main(["--llm-model", "m"]) == 2
    assert "--llm-url" in capsys.readouterr().err
