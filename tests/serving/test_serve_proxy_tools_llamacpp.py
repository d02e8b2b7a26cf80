"""Tool calls through ``gnll serve --upstream`` in front of a real llama-cpp-python server (the
session's ``llama_server``: SmolLM2's GGUF, its own chat template, which has no tool section).

llama-cpp-python serves a *named* ``tool_choice`` by decoding the function's arguments under a
grammar and returning them as the call (no name among the tokens); it answers ``"auto"`` and
``"required"`` in plain text (its template cannot show the tools). The proxy finds the arguments in
the reported tokens, reports each argument value's NLL over its own tokens, and says which
distribution they are: llama-cpp-python reports the raw one (a token the grammar forced keeps its
log-prob, below the unconstrained top alternative).
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from gnll.policy import AbstentionPolicy
from gnll.serving import ServeSettings, create_app
from gnll.serving.proxy import ProxyService
from gnll.serving.server import ServerThread

pytestmark = pytest.mark.server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _proxy(url: str, **settings) -> ServerThread:
    return ServerThread(create_app(ProxyService(url, timeout=300), ServeSettings(**settings)))


def test_a_named_call_is_scored_on_its_argument_tokens(llama_server):
    with _proxy(llama_server.base_url) as px:
        client = openai.OpenAI(base_url=px.url + "/v1", api_key="x", max_retries=0, timeout=300)
        r = client.chat.completions.create(
            model="smollm2-135m-instruct", messages=ASK, tools=[WEATHER], tool_choice=NAMED,
            temperature=0, max_tokens=40, logprobs=True, top_logprobs=1,
        )  # fmt: skip
    choice = r.choices[0]
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    u = choice.uncertainty
    assert u["structured"] == {"type": "tool_calls", "logprobs": "raw"}
    [rec] = u["tool_calls"]
    assert rec["name"] == "get_weather" and rec["name_tokens"] == [] and rec["name_nll"] == 0
    [arg] = rec["arguments"]
    assert arg["path"] == "city" and arg["text"] == "Paris"
    parts = rec["structure_tokens"] + arg["token_indices"]
    assert sorted(parts) == rec["token_indices"]  # every token of the call in one part
    content = choice.logprobs.content
    reported = [e.logprob for e in content]

    def nll(ks):
        return -sum(reported[k] for k in ks)

    # the record's numbers are sums of the reported log-probs over the tokens it names
    assert rec["g_nll"] == pytest.approx(
        nll(rec["token_indices"]), abs=1e-9
    )  # same path: sums of the log-probs the server reported
    assert arg["nll"] == pytest.approx(
        nll(arg["token_indices"]), abs=1e-9
    )  # same path: sums of the log-probs the server reported
    assert "Paris" in "".join(content[k].token for k in arg["token_indices"])
    # raw, not renormalised over the grammar: the forced "{" is far below the unconstrained top
    first = content[0]
    assert first.token.strip() == "{"
    assert first.top_logprobs[0].token != first.token
    assert first.top_logprobs[0].logprob > first.logprob + 1.0


@pytest.mark.parametrize("stream", [False, True])
def test_a_withheld_named_call_leaks_no_byte(llama_server, stream):
    body = {
        "model": "smollm2-135m-instruct",
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": NAMED,
        "max_tokens": 40,
        "stream": stream,
    }
    policy = AbstentionPolicy(mode="refuse", threshold=1.0)
    with _proxy(llama_server.base_url, policy=policy) as px:
        r = httpx.post(px.url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    assert "Paris" not in r.text and '"function_call"' not in r.text
    assert "withheld: get_weather (call 0)" in r.text
