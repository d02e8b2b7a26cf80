"""`gnll serve --upstream URL --policy refuse`: the proxy closes the upstream's stream at the exact
early decision, and the upstream sees the disconnect there.

The upstream is a stand-in OpenAI server that streams a 200-token answer, one token per chunk with
a pause between them, and records how many tokens it had sent when its client went away (a write
to a closed connection fails).
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from escalate_standins import StandInHandler, StandInServer

from gnll.serving import AbstentionPolicy, ServeSettings, create_app
from gnll.serving.proxy import ProxyService
from gnll.serving.server import ServerThread

TOKENS = 200
LOGPROB = -0.5
PAUSE = 0.05


class StreamingUpstream(StandInServer):
    """An OpenAI-compatible stand-in whose streamed answers record the client's disconnect."""

    def __init__(self) -> None:
        self.sent: list[int] = []  # per streamed request: tokens written before the end
        self.disconnected: list[bool] = []
        self.done = threading.Event()
        outer = self

        class Handler(StandInHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = self.read_body()
                if not body.get("stream"):
                    toks = [f" w{i}" for i in range(TOKENS)]
                    lp = {"tokens": toks, "token_logprobs": [LOGPROB] * TOKENS}
                    c = {"index": 0, "text": "".join(toks), "logprobs": lp, "finish_reason": "stop"}
                    self.json({"id": "x", "model": "fake", "choices": [c]})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                sent, gone = 0, False
                try:
                    for i in range(min(TOKENS, body.get("max_tokens") or TOKENS)):
                        lp = {"tokens": [f" w{i}"], "token_logprobs": [LOGPROB]}
                        chunk = {
                            "index": 0,
                            "text": f" w{i}",
                            "logprobs": lp,
                            "finish_reason": None,
                        }
                        self.event({"id": "x", "model": "fake", "choices": [chunk]})
                        sent += 1
                        time.sleep(PAUSE)
                    last = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
                    self.event({"id": "x", "model": "fake", "choices": [last]})
                    self.event("[DONE]")
                except (BrokenPipeError, ConnectionResetError):
                    gone = True  # the client closed the connection: stop generating
                outer.sent.append(sent)
                outer.disconnected.append(gone)
                outer.done.set()

        super().__init__(Handler)


@pytest.fixture
def upstream():
    up = StreamingUpstream()
    yield up
    up.close()


def proxy(url: str, **settings) -> ServerThread:
    return ServerThread(create_app(ProxyService(url, server="vllm"), ServeSettings(**settings)))


def test_proxy_disconnects_the_upstream_at_the_decision_token(upstream):
    policy = AbstentionPolicy(mode="refuse", threshold=3.0)
    with proxy(upstream.url, policy=policy, early=True) as px:
        r = httpx.post(
            px.url + "/v1/completions",
            json={"model": "fake", "prompt": "q", "max_tokens": TOKENS},
            timeout=60,
        )
    u = r.json()["choices"][0]["uncertainty"]
    # 7 tokens of NLL 0.5 pass the threshold 3.0: decided there, the rest never asked for.
    assert u["refused"] is True and u["early"] is True and u["decided_at_token"] == 7
    assert u["g_nll"] == 3.5 and u["tokens_saved"] == TOKENS - 7
    # The upstream never counted the cut answer: the proxy counts what it received (this
    # stand-in sends no running usage, so the prompt's count is unknown).
    assert r.json()["usage"] == {
        "prompt_tokens": None,
        "completion_tokens": 7,
        "total_tokens": None,
    }
    assert upstream.done.wait(30)
    assert upstream.disconnected == [True]
    # The upstream notices at its next writes after the close (a write into the socket buffer
    # may still succeed); it stopped long before its 200 tokens.
    assert 7 <= upstream.sent[0] <= 7 + 10


def test_proxy_decides_at_the_end_unless_asked_to_decide_early(upstream):
    policy = AbstentionPolicy(mode="refuse", threshold=3.0)
    with proxy(upstream.url, policy=policy) as px:  # the default in proxy mode
        r = httpx.post(
            px.url + "/v1/completions",
            json={"model": "fake", "prompt": "q", "max_tokens": TOKENS},
            timeout=60,
        )
    u = r.json()["choices"][0]["uncertainty"]
    assert u["refused"] is True and "early" not in u and u["g_nll"] == 100.0
    assert upstream.sent == []  # one non-streaming request: nothing was cut


def test_an_answer_the_policy_keeps_is_streamed_to_its_end(upstream):
    policy = AbstentionPolicy(mode="refuse", threshold=1000.0)
    with proxy(upstream.url, policy=policy, early=True) as px:
        r = httpx.post(
            px.url + "/v1/completions",
            json={"model": "fake", "prompt": "q", "max_tokens": 20},
            timeout=60,
        )
    c = r.json()["choices"][0]
    assert c["uncertainty"]["abstain"] is False and c["uncertainty"]["g_nll"] == 10.0
    assert c["text"] == "".join(f" w{i}" for i in range(20))
    assert upstream.done.wait(30) and upstream.disconnected == [False]
