"""Exact early decisions on tool calls through the proxy (``gnll serve --upstream``): with early
decisions on, under ``refuse`` or ``escalate``, the proxy streams the upstream's answer, reads the
call in it token by token (:class:`gnll.toolwatch.ToolCallDecision`, as in-process) and closes the
connection at the token where the call's argument crosses its threshold; the client gets the
withheld message and the record saying where, and no byte of the call.

The upstream is a stand-in shaped like vLLM with ``--tool-call-parser hermes``: it writes a
``<tool_call>`` block one token per chunk with chosen log-probs, its parser's ``tool_calls``
deltas, its end-of-sequence token last, and it records how many tokens it had sent when its
client went away. A call the watch does not decide on is decided at the end of the output, as
when early decisions are off: the two responses are compared whole.

Before, the proxy decided tool calls only at the end of the output (a non-streamed request).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest
from escalate_standins import StandInHandler, StandInServer
from serve_helpers import check_withheld_call
from test_serve_tools_escalate import TOOLS, USER, Caller, reply

from gnll.policy import AbstentionPolicy
from gnll.serving import ServeSettings, build_inprocess_app, build_proxy_app
from gnll.serving.server import ServerThread
from gnll.toolwatch import CallWatch

ARGS = '{"city": "Pariss"}'
#: gnll's documented call format (vLLM's hermes parser reads it), one token per 4 characters.
HERMES = f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>'
#: Another model's format (vLLM's llama3_json parser): no ``<tool_call>`` block.
LLAMA = f'{{"name": "get_weather", "parameters": {ARGS}}}'
EOS = "<|im_end|>"
PAUSE = 0.02  # seconds between two tokens
HARD = -1.5  # the log-prob of each token inside the city


def tokens_of(text: str) -> list[str]:
    return [text[i : i + 4] for i in range(0, len(text), 4)]


def logprobs_of(text: str) -> list[float]:
    """``HARD`` on the tokens that overlap the city's value, -0.01 elsewhere."""
    at, out, pos = text.index("Pariss"), [], 0
    for t in tokens_of(text):
        out.append(HARD if pos < at + len("Pariss") and pos + len(t) > at else -0.01)
        pos += len(t)
    return out


def _entry(tok: str, lp: float) -> dict[str, Any]:
    return {"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []}


class CallUpstream(StandInServer):
    """A vLLM-shaped upstream whose model writes ``text`` (a call of get_weather) one token per
    chunk. Records per streamed request the tokens sent and whether the client went away, and
    counts the requests answered whole. ``max_tokens`` cuts the output (no call is then parsed)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.sent: list[int] = []
        self.disconnected: list[bool] = []
        self.whole = 0
        self.done = threading.Event()
        outer = self

        class Handler(StandInHandler):
            model = "small"

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                m = {"id": "small", "object": "model", "owned_by": "vllm", "max_model_len": 2048}
                self.json({"object": "list", "data": [m]})

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = self.read_body()
                toks, lps = tokens_of(outer.text), logprobs_of(outer.text)
                cut = body.get("max_tokens") is not None and body["max_tokens"] < len(toks)
                if cut:
                    toks, lps = toks[: body["max_tokens"]], lps[: body["max_tokens"]]
                else:
                    toks, lps = [*toks, EOS], [*lps, -0.01]  # vLLM reports its EOS token last
                call = {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ARGS},
                }
                finish = "length" if cut else "tool_calls"
                n = len(toks)
                usage = {"prompt_tokens": 9, "total_tokens": 9 + n, "completion_tokens": n}
                base = {"id": "chatcmpl-s", "created": 1, "model": "small"}
                if not body.get("stream"):
                    outer.whole += 1
                    text = "".join(toks) if cut else None
                    message = {"role": "assistant", "content": text}
                    if not cut:
                        message["tool_calls"] = [call]
                    choice = {
                        "index": 0,
                        "message": message,
                        "logprobs": {
                            "content": [_entry(t, lp) for t, lp in zip(toks, lps, strict=True)]
                        },
                        "finish_reason": finish,
                    }
                    # vLLM's (and OpenAI's) order: id, object, created, model, choices, usage
                    head = {"id": base["id"], "object": "chat.completion", **base}
                    self.json({**head, "choices": [choice], "usage": usage})
                    return
                self.stream(body, base, toks, lps, call, finish, usage, cut)

            def stream(self, body, base, toks, lps, call, finish, usage, cut) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                base = {**base, "object": "chat.completion.chunk"}
                role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
                self.event({**base, "choices": [{**role, "logprobs": None, "finish_reason": None}]})
                sent, written = 0, ""
                body_toks = toks if cut else toks[:-1]
                try:
                    for tok, lp in zip(body_toks, lps, strict=False):
                        before, written = written, written + tok
                        delta: dict[str, Any] = {}
                        if '"get_weather"' in written and '"get_weather"' not in before:
                            head = {k: call[k] for k in ("id", "type")}
                            delta = {"tool_calls": [{"index": 0, **head, "function": {"name": "get_weather"}}]}  # fmt: skip
                        elif not cut and written == "".join(body_toks):
                            args = {"arguments": ARGS}
                            delta = {"tool_calls": [{"index": 0, "function": args}]}
                        c = {"index": 0, "delta": delta, "logprobs": {"content": [_entry(tok, lp)]}}
                        self.event({**base, "choices": [{**c, "finish_reason": None}]})
                        sent += 1
                        if self.client_left(PAUSE):
                            return outer.record(sent, True)
                    last_lp = {"content": [] if cut else [_entry(EOS, lps[-1])]}
                    c = {"index": 0, "delta": {}, "logprobs": last_lp, "finish_reason": finish}
                    self.event({**base, "choices": [c]})
                    if (body.get("stream_options") or {}).get("include_usage"):
                        self.event({**base, "choices": [], "usage": usage})
                    self.event("[DONE]")
                except (BrokenPipeError, ConnectionResetError):
                    return outer.record(sent, True)
                outer.record(sent, False)

        super().__init__(Handler)

    def record(self, sent: int, gone: bool) -> None:
        self.sent.append(sent)
        self.disconnected.append(gone)
        self.done.set()


@pytest.fixture
def hermes():
    up = CallUpstream(HERMES)
    yield up
    up.close()


def _settings(early: bool | None = True, threshold: float = 100.0, argument: float | None = 2.0):
    return ServeSettings(
        policy=AbstentionPolicy(mode="refuse", threshold=threshold),
        tool_argument_threshold=argument,
        early=early,
    )


def _post(url: str, settings: ServeSettings, **body: Any) -> httpx.Response:
    with ServerThread(build_proxy_app(url, settings)) as px:
        body = {"messages": USER, "tools": TOOLS, "max_tokens": 100, **body}
        r = httpx.post(px.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r


def _read(r: httpx.Response, stream: bool) -> tuple[dict, dict, dict | None]:
    """The withheld call's record, the choice's, and the usage (stream and not)."""
    rec, record = check_withheld_call(r, stream)
    if not stream:
        return rec, record, r.json()["usage"]
    events = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
    return rec, record, next((e["usage"] for e in events if e.get("usage")), None)


def _watched(text: str, argument: float) -> CallWatch:
    """The end-of-output watch over the whole output (what in-process runs over every output)."""
    return CallWatch(lambda g: g > 100.0, argument_threshold=argument).read(
        tokens_of(text), logprobs_of(text)
    )


def test_the_watch_decides_at_the_citys_second_token():
    """The numbers the tests below rest on, by hand: tokens 0-2 are the tag, the call's object
    starts at token 3; token 14 ``: "P`` is the first with a character of the city (NLL 1.5, not
    over 2.0), token 15 ``aris`` the second (3.0): decided there, 16 of 21 tokens read."""
    toks = tokens_of(HERMES)
    assert (toks[3], toks[14], toks[15], len(toks)) == ('{"na', ': "P', "aris", 21)
    watch = _watched(HERMES, 2.0)
    assert (watch.decided_call, watch.decided_at) == (0, 16)
    [city] = watch.report()[0]["arguments"]
    assert city["token_indices"] == [14, 15] and city["nll"] == pytest.approx(3.0)


@pytest.mark.parametrize("stream", [False, True])
def test_the_proxy_stops_reading_at_the_crossing_token(hermes, stream):
    r = _post(hermes.url, _settings(), stream=stream)
    raw = r.text.replace('\\"', '"')  # strings inside strings unescaped
    assert "Paris" not in raw and '"city": "' not in raw and '"arguments": {' not in raw
    rec, u, usage = _read(r, stream)
    assert u["refused"] is True and u["early"] is True
    assert u["decided_at_token"] == 16 == _watched(HERMES, 2.0).decided_at
    assert u["tokens_generated"] == 16 and u["tokens_saved"] == 100 - 16
    assert u.get("tool_call_error") is None  # the block cut at its decision is no error
    assert rec["early"] is True and rec["name"] == "get_weather"
    assert rec["arguments_over_threshold"] == ["city"] and "text" not in rec["arguments"][0]
    assert rec["token_indices"] == list(range(3, 16))  # the call's tokens read (not the tag)
    assert rec["arguments"][0]["nll"] == pytest.approx(3.0)
    # The upstream was cut there: it noticed at its next write, before its 22 tokens; it
    # was never asked for a whole answer.
    assert hermes.done.wait(30) and hermes.disconnected == [True]
    assert 16 <= hermes.sent[0] <= 16 + 3 and hermes.whole == 0
    # What was generated until the cut, vLLM's prompt count unknown from this stand-in's stream.
    if usage is not None:
        assert usage["completion_tokens"] == 16


@pytest.mark.parametrize("stream", [False, True])
def test_escalate_asks_the_larger_model_at_the_crossing_token(hermes, stream):
    big = Caller("big", "Paris", -0.05)
    with ServerThread(build_inprocess_app(big, ServeSettings(), max_wait_ms=1)) as b_srv:
        settings = ServeSettings(
            policy=AbstentionPolicy(mode="escalate", threshold=100.0), tool_argument_threshold=2.0
        )  # early decisions by default: escalate, and the upstream streams its usage (vLLM)
        app = build_proxy_app(
            hermes.url, settings, escalate_to=b_srv.url + "/v1", escalate_model="big"
        )
        with ServerThread(app) as px:
            body = {"messages": USER, "tools": TOOLS, "stream": stream, "max_tokens": 100}
            r = httpx.post(px.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert "Pariss" not in r.text and r.headers["x-answered-by"] == "big"
    args, last = reply(r.text, stream)
    assert json.loads(args) == {"city": "Paris"}  # the larger model's call
    u = last["uncertainty"]
    assert u["escalated"] is True and u["answered_by"] == "big"
    loc = u["local"]
    assert loc["early"] is True and loc["decided_at_token"] == 16
    assert loc["tool_calls"][0]["withheld"] and loc["tool_calls"][0]["early"] is True
    assert len(big.seen) == 1
    assert hermes.done.wait(30) and hermes.disconnected == [True] and hermes.sent[0] <= 19


@pytest.mark.parametrize("logprobs", [False, True])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("text", "argument"),
    [(HERMES, 5.0), (LLAMA, 2.0)],  # kept: nothing crosses; withheld at the end: not hermes
    ids=["kept", "other-format"],
)
def test_an_undecided_call_is_decided_as_at_the_end_of_the_output(text, argument, stream, logprobs):
    """Early decisions on or off, the client gets the same response: a call the watch does not
    decide (a kept call; a call in another format, which the watch never reads, withheld by
    the end-of-output gate) is decided on the whole output either way."""
    got = []
    for early in (True, False):
        up = CallUpstream(text)
        try:
            r = _post(up.url, _settings(early, argument=argument), stream=stream, logprobs=logprobs)
            assert up.done.wait(30) if early else up.whole == 1
            assert up.disconnected == ([False] if early else [])  # read to its end
        finally:
            up.close()
        got.append(r)
    assert got[0].text == got[1].text  # the same bytes
    if text == LLAMA:  # withheld at the end: the record of the whole call, no early fields
        rec, u, _ = _read(got[0], stream)
        assert u["refused"] is True and "early" not in u and "decided_at_token" not in u
        assert rec["arguments_over_threshold"] == ["city"]
        assert "Pariss" not in got[0].text
    else:
        assert "Pariss" in got[0].text  # the kept call goes out


def test_a_call_cut_by_max_tokens_after_its_crossing_is_withheld_at_the_end_too(hermes):
    """Early decisions off, the upstream's output is cut (``max_tokens`` 17) after the city's
    crossing token: its parser returns no call, only the text. The end-of-output watch reads it
    and withholds the call attempt, as the early decision does; before, the text went out."""
    r = _post(hermes.url, _settings(early=False), max_tokens=17)
    assert "Pariss" not in r.text
    rec, u, _ = _read(r, False)
    assert u["refused"] is True and rec["arguments_over_threshold"] == ["city"]
    assert "early" not in u and hermes.whole == 1
