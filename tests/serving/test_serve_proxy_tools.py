"""Tool calls through the proxy (``gnll serve --upstream``), fast tier: the upstream is in-process
``gnll serve`` on a scripted model that calls a tool (no weights). Like vLLM, it returns the call in
``message.tool_calls`` and every token the model wrote in ``logprobs.content``; the proxy finds the
call in those tokens and must report the same per-call record the upstream computed itself, and
its gate must keep a withheld call from the client entirely (stream and not).

Before, every such request was a 400 ("tools is not supported: gnll serve answers in free text").
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from serve_helpers import check_withheld_call
from test_serve_tools import CALL, LPS, TOOLS, USER, CallingModel

from gnll.policy import AbstentionPolicy
from gnll.serving import ServeSettings, build_inprocess_app, build_proxy_app
from gnll.serving.server import ServerThread

#: What the upstream's record says of a call, compared exactly (same log-probs, same partition).
KEYS = ("name", "g_nll", "num_tokens", "token_indices", "name_nll", "name_tokens", "structure_nll")


@pytest.fixture(scope="module")
def upstream():
    with ServerThread(build_inprocess_app(CallingModel(), ServeSettings(), max_wait_ms=1)) as srv:
        yield srv


def _client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)


def _proxy(upstream, **settings):
    return ServerThread(build_proxy_app(upstream.url + "/v1", ServeSettings(**settings)))


def _same_call(got: dict, want: dict) -> None:
    assert {k: got[k] for k in KEYS} == pytest.approx({k: want[k] for k in KEYS})
    assert [(a["path"], a["nll"], a["token_indices"]) for a in got["arguments"]] == pytest.approx(
        [(a["path"], a["nll"], a["token_indices"]) for a in want["arguments"]]
    )


def test_the_proxy_reports_the_upstreams_per_call_record(upstream):
    direct = _client(upstream).chat.completions.create(
        model="calling", messages=USER, tools=TOOLS, logprobs=True
    )
    with _proxy(upstream) as px:
        via = _client(px).chat.completions.create(model="calling", messages=USER, tools=TOOLS)
    [call] = via.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert via.choices[0].finish_reason == "tool_calls"
    assert via.choices[0].logprobs is None  # asked upstream by the proxy, not by the client
    [rec] = via.choices[0].uncertainty["tool_calls"]
    _same_call(rec, direct.choices[0].uncertainty["tool_calls"][0])
    assert rec["id"] == call.id
    # The parts partition the call, and the call plus the tags the whole output.
    parts = rec["name_tokens"] + rec["structure_tokens"]
    parts += [k for a in rec["arguments"] for k in a["token_indices"]]
    assert sorted(parts) == rec["token_indices"]
    assert rec["g_nll"] == pytest.approx(-sum(LPS[k] for k in rec["token_indices"]))
    assert via.choices[0].uncertainty["g_nll"] == pytest.approx(-sum(LPS))


def test_a_streamed_call_goes_out_as_it_comes_with_its_record_last(upstream):
    with _proxy(upstream) as px:
        chunks = list(
            _client(px).chat.completions.create(
                model="calling", messages=USER, tools=TOOLS, stream=True
            )
        )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    arguments = "".join(
        t.function.arguments or "" for d in deltas for t in d.tool_calls or [] if t.function
    )
    assert json.loads(arguments) == {"city": "Paris"}
    last = chunks[-1].choices[0]
    assert last.finish_reason == "tool_calls"
    [rec] = last.uncertainty["tool_calls"]
    assert rec["name"] == "get_weather" and rec["arguments"][0]["text"] == "Paris"
    assert rec["g_nll"] == pytest.approx(-sum(LPS[k] for k in rec["token_indices"]))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "gate",
    [
        {"policy": AbstentionPolicy(mode="refuse", threshold=1.0)},  # the call's G-NLL
        {  # one argument value's NLL
            "policy": AbstentionPolicy(mode="refuse", threshold=1e6),
            "tool_argument_threshold": 0.5,
        },
    ],
)
def test_a_withheld_call_leaks_no_byte(upstream, gate, stream):
    body = {"model": "calling", "messages": USER, "tools": TOOLS, "stream": stream}
    with _proxy(upstream, **gate) as px:
        r = httpx.post(px.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert "Paris" not in r.text, [x for x in r.text.splitlines() if "Paris" in x]
    rec, record = check_withheld_call(r, stream)
    assert "text" not in rec["arguments"][0]
    assert record["refused"] is True and record.get("tokens") is None


def test_an_upstreams_refusal_is_its_own_error_named(upstream):
    """The scripted upstream cannot decode under a grammar: its 400 comes back, saying which
    server refused what (not gnll's old "answers in free text")."""
    with _proxy(upstream) as px, pytest.raises(openai.BadRequestError) as err:
        _client(px).chat.completions.create(
            model="calling", messages=USER, response_format={"type": "json_object"}
        )
    message = err.value.body["message"]
    assert message.startswith("the upstream gnll server refused response_format json_object:")
    assert "cannot decode under a grammar" in message
    assert "answers in free text" not in message


def test_call_text_is_the_output_the_tokens_spell():
    """The scripted call is the documented format; the proxy located it in the tokens."""
    assert CALL.startswith("<tool_call>")


def test_a_replayed_call_carries_the_outputs_logprobs(upstream):
    """Under refuse a kept call is replayed once decided; its stream carries the call's
    deltas and the same log-probs as the body (they spell the call, not the text)."""
    kw = {"model": "calling", "messages": USER, "tools": TOOLS, "logprobs": True}
    policy = AbstentionPolicy(mode="refuse", threshold=1e6)
    with _proxy(upstream, policy=policy) as px:
        body = _client(px).chat.completions.create(**kw)
        chunks = list(_client(px).chat.completions.create(stream=True, **kw))
    want = [(e.token, e.logprob) for e in body.choices[0].logprobs.content]
    got = [
        (e.token, e.logprob)
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content or []
    ]
    assert got == want and len(want) == len(LPS)
    assert any(c.choices[0].delta.tool_calls for c in chunks if c.choices)


def test_a_responses_api_call_through_the_proxy_has_the_same_record(upstream):
    """``/v1/responses`` with function tools is translated to chat and takes this path: its
    ``function_call`` item carries the call's record, as the upstream's own."""
    tools = [
        {
            "type": "function",
            "name": t["function"]["name"],
            "parameters": t["function"]["parameters"],
        }
        for t in TOOLS
    ]
    body = {"model": "calling", "input": "Weather in Paris?", "tools": tools}
    got = []
    with _proxy(upstream) as px:
        for srv in (upstream, px):
            r = httpx.post(srv.url + "/v1/responses", json=body, timeout=30)
            assert r.status_code == 200, r.text
            [item] = r.json()["output"]
            assert item["type"] == "function_call" and item["name"] == "get_weather"
            assert json.loads(item["arguments"]) == {"city": "Paris"}
            got.append(item["uncertainty"]["tool_calls"][0])
    _same_call(got[1], got[0])
