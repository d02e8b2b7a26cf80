"""The OpenAI-compatible backend against a local stand-in server that answers like vLLM.

This checks request building and response parsing (plumbing), not a real model: the stand-in replays
fixed log-probs for whatever it is asked.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gnll import GenerationConfig, load_model, measures


class _Handler(BaseHTTPRequestHandler):
    requests: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        if body["prompt"] == "fail":
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"error": "bad prompt"}')
            return
        choices = []
        for i in range(body["n"]):
            choices.append(
                {
                    "index": i,
                    "text": " Paris",
                    "finish_reason": "stop",
                    "stop_reason": "\n",
                    "logprobs": {
                        "tokens": ["token_id:12", "token_id:7"],
                        "token_logprobs": [-0.5, -0.25 * (i + 1)],
                    },
                }
            )
        payload = json.dumps({"choices": choices}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture()
def server():
    _Handler.requests = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def test_greedy_and_sampling_round_trip(server):
    model = load_model("served-model", backend="openai", base_url=server, timeout=10)
    [[g]] = model.generate(["Question: capital of France?\nAnswer:"])
    assert g.text == "Paris" and g.token_ids == [12, 7] and g.finish_reason == "stop"
    assert measures.g_nll(g.token_logprobs) == pytest.approx(0.75)
    greedy_req = _Handler.requests[-1]
    assert greedy_req["temperature"] == 0.0 and greedy_req["logprobs"] == 1
    assert greedy_req["stop"] == ["\n", "Question:", "Context:"]

    [samples] = model.generate(["q"], GenerationConfig.sample(3, temperature=0.5, seed=1))
    assert [s.logprob for s in samples] == pytest.approx([-0.75, -1.0, -1.25])
    req = _Handler.requests[-1]
    assert req["n"] == 3 and req["temperature"] == 0.5 and "seed" in req


def test_errors_are_clear(server):
    model = load_model("served-model", backend="openai", base_url=server, timeout=10)
    with pytest.raises(RuntimeError, match="HTTP 400"):
        model.generate(["fail"])
    with pytest.raises(NotImplementedError, match="beam"):
        model.generate(["q"], GenerationConfig.beam(2))
    with pytest.raises(NotImplementedError, match="stop string"):
        model.generate(["q"], GenerationConfig.greedy(include_terminator=True))
    with pytest.raises(ValueError, match="base_url"):
        load_model("served-model", backend="openai")
    dead = load_model("served-model", backend="openai", base_url="http://127.0.0.1:9/v1", timeout=2)
    with pytest.raises(ConnectionError, match="cannot reach"):
        dead.generate(["q"])
