"""A replayed stream carries every field of the upstream's message, the reasoning trace included.

The proxy replays a whole upstream answer as chunks under ``--policy refuse`` and for
``include_usage`` to an upstream not known to stream its usage. Before, the replay carried
``content`` only: a streaming client lost the trace that the non-streamed response and a live
stream both carry. The upstream is a stand-in answering with a CONSTRUCTED vLLM-shaped reasoning
response (tests/fixtures/reasoning/vllm_chat.json).
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from standin import StandIn

from gnll.serving import AbstentionPolicy, ServeSettings, create_app
from gnll.serving.proxy import ProxyService
from gnll.serving.server import ServerThread

FIX = Path(__file__).parents[1] / "fixtures" / "reasoning"
MSG = [{"role": "user", "content": "What is 2+2?"}]
TRACE = json.loads((FIX / "vllm_chat.json").read_text())["choices"][0]["message"]["reasoning"]


def respond_as(owner: str):
    payload = (FIX / "vllm_chat.json").read_bytes()

    def respond(method, path, body):
        if path.endswith("/models"):
            return 200, {"object": "list", "data": [{"id": "r1", "owned_by": owner}]}
        return 200, payload

    return respond


def streamed(owner: str, settings: ServeSettings, **kw):
    with (
        StandIn(respond_as(owner)) as up,
        ServerThread(create_app(ProxyService(up.url, timeout=30), settings)) as srv,
    ):
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)
        chunks = list(c.chat.completions.create(model="r1", messages=MSG, stream=True, **kw))
        whole = c.chat.completions.create(model="r1", messages=MSG)
        assert up.requests[-2][2]["stream"] is False  # the stream was a replay
    parts = [ch.choices[0].delta for ch in chunks if ch.choices]
    reasoning = "".join(getattr(d, "reasoning", None) or "" for d in parts)
    content = "".join(d.content or "" for d in parts)
    return reasoning, content, chunks, whole


def test_include_usage_replay_keeps_the_trace():
    reasoning, content, chunks, whole = streamed(
        "someone", ServeSettings(), stream_options={"include_usage": True}
    )
    assert reasoning == TRACE == whole.choices[0].message.reasoning
    assert content == "The answer is 4."
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


@pytest.mark.parametrize("threshold", [0.1, 100.0])
def test_refuse_replay_keeps_the_trace(threshold):
    policy = AbstentionPolicy(mode="refuse", threshold=threshold)
    reasoning, content, chunks, whole = streamed("vllm", ServeSettings(policy=policy))
    assert reasoning == TRACE == whole.choices[0].message.reasoning
    assert content == whole.choices[0].message.content
    # g_nll 0.15: refused at 0.1 (the trace stays, as in the non-streamed response), kept at 100
    assert bool(whole.choices[0].uncertainty.get("refused")) is (threshold < 0.15)
