"""``--policy escalate`` with tool calls: a call the gate withholds is asked again of the larger
model (same tools and tool_choice), and the client gets the larger model's call with the
escalation record; no byte of the withheld call reaches the client (stream and not).

Two scripted models on loopback: the local one calls ``get_weather`` with an uncertain argument
(``"Pariss"``), the larger one calls it with ``"Paris"``."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from typing import Any

import httpx
import openai
import pytest
from serve_helpers import ScriptedModel, escalating
from tool_sets import GET_WEATHER

from gnll.backends.base import Generation, Model
from gnll.policy import AbstentionPolicy
from gnll.serving import ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread

TOOLS = [GET_WEATHER]
USER = [{"role": "user", "content": "Weather in the capital of France?"}]


def _call(city: str) -> str:
    return (
        f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{city}"}}}}\n</tool_call>'
    )


class Caller(ScriptedModel):
    """Calls get_weather(city) when the prompt lists tools, one token per 4 characters, each
    token's log-prob ``lp`` except ``hard`` on the tokens inside the city."""

    def __init__(self, name: str, city: str, hard: float) -> None:
        super().__init__()
        self.name, self.city, self.hard = name, city, hard
        self.seen: list[str] = []

    def generate(self, prompts, config=None, **kwargs):
        if not any("<tools>" in p for p in prompts):
            return super().generate(prompts, config, **kwargs)
        self.seen.extend(prompts)
        city, hard = ("Rome", -0.02) if "Rome" in prompts[0] else (self.city, self.hard)
        text = _call(city)
        toks = [text[i : i + 4] for i in range(0, len(text), 4)]
        at = text.index(city)
        lps, pos = [], 0
        for t in toks:
            inside = pos < at + len(city) and pos + len(t) > at
            lps.append(hard if inside else -0.01)
            pos += len(t)
        return [[Generation(text, list(range(len(toks))), toks, lps, "eos")] for _ in prompts]


def gated(
    small: Model, big: Model | None = None, argument_threshold: float = 2.0, **settings: Any
) -> AbstractContextManager[ServerThread]:
    """``small`` served in-process under ``--policy escalate --tool_argument_threshold``
    (``settings``: more :class:`ServeSettings`), escalating to ``big`` served on loopback (by
    default the larger :class:`Caller`, whose call is sure); both stop when the block ends. The
    G-NLL threshold is out of reach: only the tool gate escalates."""
    policy = AbstentionPolicy(mode="escalate", threshold=100.0)
    return escalating(
        small,
        Caller("big", "Paris", -0.05) if big is None else big,
        ServeSettings(policy=policy, tool_argument_threshold=argument_threshold, **settings),
        max_wait_ms=1,
        escalate_model="big",
    )


def reply(text: str, stream: bool) -> tuple[str, dict[str, Any]]:
    """A chat reply's tool call arguments (the stream's pieces joined) and its last (finished)
    choice."""
    if stream:
        events = [json.loads(x[6:]) for x in text.splitlines() if x.startswith("data: {")]
        args = "".join(
            tc["function"].get("arguments") or ""
            for e in events
            for c in e["choices"]
            for tc in c.get("delta", {}).get("tool_calls") or []
        )
        last = [c for e in events for c in e["choices"] if c.get("finish_reason")][-1]
    else:
        last = json.loads(text)["choices"][0]
        args = last["message"]["tool_calls"][0]["function"]["arguments"]
    return args, last


@pytest.fixture(scope="module")
def servers():
    big = Caller("big", "Paris", -0.05)
    small = Caller("small", "Pariss", -1.5)
    with gated(small, big) as local:
        yield local, small, big


def _client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)


def test_a_withheld_call_is_asked_of_the_larger_model(servers):
    local, small, big = servers
    n = len(big.seen)
    raw = _client(local).chat.completions.with_raw_response.create(
        model="small", messages=USER, tools=TOOLS, tool_choice="auto"
    )
    assert raw.headers["x-answered-by"] == "big"
    choice = raw.parse().choices[0]
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}  # the larger model's call
    assert choice.finish_reason == "tool_calls"
    u = choice.uncertainty
    assert u["escalated"] is True and u["answered_by"] == "big"
    local_rec = u["local"]
    assert local_rec["abstain"] is True and local_rec["model"] == "small"
    [withheld] = local_rec["tool_calls"]
    assert withheld["withheld"] and withheld["arguments_over_threshold"] == ["city"]
    assert "Pariss" not in json.dumps(u)  # the withheld call's argument is not in the record
    [sent] = u["tool_calls"]  # the larger model's call, scored from its log-probs
    assert sent["name"] == "get_weather" and sent["withheld"] is False
    assert [a["path"] for a in sent["arguments"]] == ["city"] and sent["arguments"][0]["nll"] < 2.0
    # the larger model was asked with the same tools (its prompt lists them)
    assert len(big.seen) == n + 1 and "get_weather" in big.seen[-1]


@pytest.mark.parametrize("stream", [False, True])
def test_no_byte_of_the_withheld_call_reaches_the_client(servers, stream):
    local, _, _ = servers
    body = {"model": "small", "messages": USER, "tools": TOOLS, "stream": stream, "logprobs": True}
    raw = httpx.post(local.url + "/v1/chat/completions", json=body, timeout=30).text
    assert "Pariss" not in raw
    if stream:
        events = [json.loads(x[6:]) for x in raw.splitlines() if x.startswith("data: {")]
        deltas = [c["delta"] for e in events for c in e["choices"] if "delta" in c]
        args = "".join(
            tc["function"].get("arguments") or ""
            for d in deltas
            for tc in d.get("tool_calls") or []
        )
        assert json.loads(args) == {"city": "Paris"}
        last = [c for e in events for c in e["choices"] if c.get("finish_reason")][-1]
        assert last["finish_reason"] == "tool_calls"
        assert last["uncertainty"]["escalated"] is True
    else:
        data = json.loads(raw)
        msg = data["choices"][0]["message"]
        assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}


@pytest.mark.parametrize("stream", [False, True])
def test_a_sure_call_stays_local(servers, stream):
    local, small, big = servers
    n = len(big.seen)
    c = _client(local)
    rome = [{"role": "user", "content": "Weather in Rome?"}]
    if stream:
        chunks = list(
            c.chat.completions.create(model="small", messages=rome, tools=TOOLS, stream=True)
        )
        args = "".join(
            tc.function.arguments or ""
            for x in chunks
            for ch in x.choices
            for tc in ch.delta.tool_calls or []
        )
        last = [ch for x in chunks for ch in x.choices if ch.finish_reason][-1]
        u = last.uncertainty
    else:
        choice = c.chat.completions.create(model="small", messages=rome, tools=TOOLS).choices[0]
        args, u = choice.message.tool_calls[0].function.arguments, choice.uncertainty
    assert json.loads(args) == {"city": "Rome"}
    assert u["escalated"] is False and u["answered_by"] == "small" and u["abstain"] is False
    assert u["tool_calls"][0]["withheld"] is False
    assert len(big.seen) == n  # the larger model was not asked


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_withheld_at_its_early_decision_is_asked_of_the_larger_model(stream):
    """The local model's call stops at the token where its argument crosses the threshold (exact
    early decision, serve_helpers' decoding loop); the larger model's call is sent, and the
    escalation record's ``local`` says where the local decision was made."""
    from test_serve_tools_early import MAX_TOKENS, TOKENS
    from test_serve_tools_early import Caller as LoopCaller

    small = LoopCaller()
    with gated(small, argument_threshold=1.5) as local:
        body = {
            "messages": USER,
            "tools": TOOLS,
            "max_tokens": MAX_TOKENS,
            "stream": stream,
        }
        raw = httpx.post(local.url + "/v1/chat/completions", json=body, timeout=30).text
    assert "France" not in raw  # the local call's argument ("Paris, France") never sent
    args, last = reply(raw, stream)
    assert json.loads(args) == {"city": "Paris"}  # the larger model's call
    u = last["uncertainty"]
    assert u["escalated"] is True and u["answered_by"] == "big"
    loc = u["local"]
    assert loc["early"] is True and 0 < loc["decided_at_token"] < len(TOKENS)
    assert loc["tokens_saved"] == MAX_TOKENS - loc["decided_at_token"]
    assert small.generated == loc["decided_at_token"]  # the rest was never generated
    assert loc["tool_calls"][0]["withheld"] and loc["tool_calls"][0]["early"] is True


@pytest.mark.parametrize("stream", [False, True])
def test_through_the_proxy_a_withheld_call_is_asked_of_the_larger_model(stream):
    """``gnll serve --upstream SMALL --policy escalate --escalate_to BIG``: the small server's call
    is withheld by the proxy's gate and the larger server's call is sent, with its own per-call
    record and the escalation record; no byte of the small server's call reaches the client."""
    from gnll.serving import build_proxy_app

    small = Caller("small", "Pariss", -1.5)
    big = Caller("big", "Paris", -0.05)
    with (
        ServerThread(build_inprocess_app(small, ServeSettings(), max_wait_ms=1)) as s_srv,
        ServerThread(build_inprocess_app(big, ServeSettings(), max_wait_ms=1)) as b_srv,
    ):
        settings = ServeSettings(
            policy=AbstentionPolicy(mode="escalate", threshold=100.0), tool_argument_threshold=2.0
        )
        app = build_proxy_app(
            s_srv.url + "/v1", settings, escalate_to=b_srv.url + "/v1", escalate_model="big"
        )
        with ServerThread(app) as px:
            body = {"messages": USER, "tools": TOOLS, "stream": stream, "logprobs": True}
            r = httpx.post(px.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert "Pariss" not in r.text
    assert r.headers["x-answered-by"] == "big"
    args, last = reply(r.text, stream)
    assert json.loads(args) == {"city": "Paris"}
    u = last["uncertainty"]
    assert u["escalated"] is True and u["answered_by"] == "big"
    [call] = u["tool_calls"]  # the larger model's call, scored from its log-probs
    assert call["name"] == "get_weather" and call["arguments"][0]["path"] == "city"
    assert call["withheld"] is False
    [local] = u["local"]["tool_calls"]
    assert local["withheld"] is True and local["arguments_over_threshold"] == ["city"]
