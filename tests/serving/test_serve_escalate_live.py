"""`gnll serve --policy escalate`: a streamed request that escalates receives the larger model's
answer live, piece by piece as the larger upstream sends it, with the escalation record in each
choice's last chunk.

The stand-ins of tests/escalate_standins.py: a small upstream whose answer is escalated at its
exact early decision (token 7), and a large one that streams its answer one token per chunk with
a pause and records when it sent its last chunk. The in-process local model is the scripted one of
test_serve_cascade.py (its ``unsure`` prompt escalates).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from escalate_standins import LargeUpstream, SmallUpstream, cascade
from serve_helpers import ScriptedModel

from gnll.serving import AbstentionPolicy, ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread

WORDS = [" The", " capital", " is", " Paris", "."]
PAUSE = 0.2  # seconds between the large stand-in's tokens: its answer takes 5 x 0.2 s
SMALL_SO_FAR = "".join(f" w{i}" for i in range(7))  # the small answer at its early decision


def _client(srv: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=60)


def _inprocess(large: LargeUpstream) -> ServerThread:
    settings = ServeSettings(policy=AbstentionPolicy(mode="escalate", threshold=1.0))
    app = build_inprocess_app(
        ScriptedModel(), settings, max_wait_ms=5, escalate_to=large.url, escalate_model="large"
    )
    return ServerThread(app)


def _serve(where: str, small: SmallUpstream, large: LargeUpstream) -> tuple[ServerThread, str]:
    """The server (proxy or in-process local model) and the prompt it escalates."""
    if where == "proxy":
        return cascade(small, large), "q"
    return _inprocess(large), "unsure"


@contextlib.contextmanager
def _running(where: str, **large: Any) -> Iterator[tuple[ServerThread, str, LargeUpstream]]:
    """The server of :func:`_serve` in front of the two stand-ins (``large``: the large one's
    options), the prompt it escalates and the large stand-in; all stop when the block ends."""
    with (
        SmallUpstream(tokens=40, pause=0.02) as small,
        LargeUpstream(tokens=WORDS, **large) as big,
    ):
        srv, prompt = _serve(where, small, big)
        with srv:
            yield srv, prompt, big


def _model(prompt: str) -> str:
    return "scripted" if prompt == "unsure" else "small"


def _stream(srv: ServerThread, prompt: str, **body: Any) -> dict[str, Any]:
    """A streamed chat request through the SDK: when each chunk came, its text, finish reasons,
    the last chunk's uncertainty and the usage."""
    raw = _client(srv).chat.completions.with_raw_response.create(
        model=_model(prompt),
        messages=[{"role": "user", "content": prompt}],
        stream=True,
        max_tokens=40,
        **body,
    )
    out: dict[str, Any] = {"header": raw.headers.get("x-answered-by"), "pieces": []}
    out.update(arrived=[], finishes=[], uncertainty=None, usage=None)
    for chunk in raw.parse():
        if chunk.usage is not None:
            out["usage"] = chunk.usage
        if not chunk.choices:
            continue
        choice = chunk.choices[0]  # the SDK loop every client writes
        if choice.delta.content:
            out["pieces"].append(choice.delta.content)
            out["arrived"].append(time.monotonic())
        if choice.finish_reason is not None:
            out["finishes"].append(choice.finish_reason)
            out["uncertainty"] = getattr(choice, "uncertainty", None)
    return out


@pytest.mark.parametrize("where", ["proxy", "in-process"])
def test_the_first_escalated_chunk_arrives_while_the_large_model_is_still_answering(where):
    with _running(where, pause=PAUSE) as (srv, prompt, large):
        got = _stream(srv, prompt)
    assert "".join(got["pieces"]) == "".join(WORDS) and got["finishes"] == ["stop"]
    (arrived,), (finished,) = large.arrived, large.finished
    answer_time = finished - arrived  # the large stand-in's whole answer: about 5 x 0.2 s
    assert answer_time >= len(WORDS) * PAUSE * 0.9
    # Held and replayed, the first piece would come after the large answer's end; live, it comes
    # with the large model's first token, and the pieces come one by one as it sends them.
    first = got["arrived"][0] - arrived
    assert first < answer_time / 2, (first, answer_time)
    assert got["arrived"][-1] - got["arrived"][0] > (len(WORDS) - 2) * PAUSE
    u = got["uncertainty"]
    assert u["escalated"] is True and u["answered_by"] == "large" == got["header"]
    assert u["g_nll"] == pytest.approx(0.1 * len(WORDS))  # the large answer's own


@pytest.mark.parametrize("where", ["proxy", "in-process"])
def test_the_streamed_record_equals_the_non_streamed_one(where):
    with _running(where) as (srv, prompt, _):
        got = _stream(srv, prompt, stream_options={"include_usage": True})
        plain = _stream(srv, prompt)
        whole = httpx.post(
            srv.url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": prompt}], "max_tokens": 40},
            timeout=60,
        )
        metrics = httpx.get(srv.url + "/metrics").text
    # the two live streams are counted as escalations once they have ended, as the whole answer is
    assert 'gnll_escalations_total{outcome="answered"} 3.0' in metrics
    expected = whole.json()["choices"][0]["uncertainty"]
    assert expected["escalated"] is True and whole.headers["x-answered-by"] == got["header"]
    assert got["uncertainty"] == expected == plain["uncertainty"]
    if where == "proxy":
        assert expected["local"]["text"] == SMALL_SO_FAR
        assert expected["local"]["decided_at_token"] == 7
    assert got["finishes"] == ["stop"] == plain["finishes"]
    # usage only when asked for, and then the large upstream's own count
    assert plain["usage"] is None and got["usage"].completion_tokens == len(WORDS)


@pytest.mark.parametrize("fail", ["status", "event"])
@pytest.mark.parametrize("where", ["proxy", "in-process"])
def test_a_failure_before_the_first_chunk_streams_the_local_answer(where, fail):
    with _running(where, fail=fail) as (srv, prompt, large):
        got = _stream(srv, prompt)
    u = got["uncertainty"]
    local_name = "small" if where == "proxy" else "scripted"
    assert u["escalated"] is False and u["answered_by"] == local_name == got["header"]
    assert large.url in u["escalation_error"] and "out of memory" in u["escalation_error"]
    text = "".join(got["pieces"])
    assert text == (SMALL_SO_FAR if where == "proxy" else "Maybe Lyon")
    assert len(got["finishes"]) == 1


@pytest.mark.parametrize("where", ["proxy", "in-process"])
def test_a_failure_mid_stream_ends_in_an_error_event_naming_the_upstream(where):
    with _running(where, fail="mid") as (srv, prompt, large):
        raw = _client(srv).chat.completions.create(
            model=_model(prompt), messages=[{"role": "user", "content": prompt}], stream=True
        )
        pieces, finishes = [], []
        with pytest.raises(openai.APIError) as err:
            for chunk in raw:
                for c in chunk.choices:
                    pieces.append(c.delta.content or "")
                    if c.finish_reason is not None:
                        finishes.append(c.finish_reason)
        metrics = httpx.get(srv.url + "/metrics").text
    assert "".join(pieces) == WORDS[0]  # the one token sent before the connection closed
    assert finishes == []  # no finish_reason faked for the cut answer
    message = str(err.value)
    assert "the escalated answer broke off" in message and large.url in message
    assert 'gnll_escalations_total{outcome="answered"} 1.0' not in metrics
