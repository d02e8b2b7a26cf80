"""Streams that should be live are live: an in-process `gnll serve` streams an answer that asks for
alternatives (`top_logprobs`) token by token, with the same alternatives as the whole answer; a
proxy in front of a `gnll serve`, and an escalation to one, relay its tokens as they are decoded.

Before, the in-process server held every stream that asked for alternatives until the answer had
ended, and the proxy asked every chat upstream for ``top_logprobs >= 1``: through a proxy in front
of `gnll serve` the first token came at 5.1 s instead of 0.3 s, and an escalation to a `gnll serve`
was not live. Liveness is checked by order, not by the clock: when the client holds the first
piece of the answer, the model has decoded only a few of its tokens.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import serve_helpers
from serve_helpers import LONG, ScriptedModel, StreamingModel, escalating

from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.serving import AbstentionPolicy, ServeSettings, build_inprocess_app, build_proxy_app
from gnll.serving.server import ServerThread

TOKENS = 30  # of LONG's 200: the answer stops at max_tokens
DELAY = 0.02  # seconds per decoding step of the stand-in


def stream(url: str, body: dict[str, Any], model: StreamingModel) -> tuple[int, list[dict]]:
    """The tokens the model had decoded when the first piece of text arrived, and every chunk."""
    at_first, chunks = None, []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            chunks.append(chunk)
            text = "".join((c.get("delta") or {}).get("content") or "" for c in chunk["choices"])
            if text and at_first is None:
                at_first = model.generated
    assert at_first is not None
    return at_first, chunks


def ask(prompt: str, **kw: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": TOKENS, **kw}


def test_inprocess_stream_with_alternatives_is_live_and_gives_the_answers_alternatives():
    model = StreamingModel(delay=DELAY)
    with ServerThread(build_inprocess_app(model, ServeSettings(), max_wait_ms=1)) as srv:
        body = ask("long", logprobs=True, top_logprobs=2)
        whole = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).json()
        before = model.generated
        at_first, chunks = stream(srv.url, {**body, "stream": True}, model)
    assert at_first - before < TOKENS // 2, at_first - before  # was TOKENS: held to the end
    entries = [
        e
        for ch in chunks
        for c in ch["choices"]
        for e in (c.get("logprobs") or {}).get("content") or []
    ]
    want = whole["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in entries] == [e["token"] for e in want]
    assert [e["top_logprobs"] for e in entries] == [e["top_logprobs"] for e in want]
    assert all(len(e["top_logprobs"]) == 2 for e in entries)
    final = [c for ch in chunks for c in ch["choices"] if c.get("uncertainty")]
    assert final[0]["uncertainty"]["g_nll"] == pytest.approx(
        whole["choices"][0]["uncertainty"]["g_nll"]
    )


def test_a_proxy_in_front_of_gnll_serve_streams_live():
    model = StreamingModel(delay=DELAY)
    upstream = build_inprocess_app(model, ServeSettings(), max_wait_ms=1)
    with ServerThread(upstream) as up, ServerThread(build_proxy_app(up.url + "/v1")) as px:
        at_first, chunks = stream(px.url, ask("long", stream=True), model)
    assert at_first < TOKENS // 2, at_first
    text = "".join(
        (c.get("delta") or {}).get("content") or "" for ch in chunks for c in ch["choices"]
    )
    assert text.strip() == "".join(LONG[0][:TOKENS]).strip()


def test_an_escalation_to_gnll_serve_streams_live(monkeypatch):
    # The larger model's server answers the escalated question at length.
    monkeypatch.setitem(serve_helpers.STREAM_SCRIPT, "unsure", LONG)
    large = StreamingModel(delay=DELAY)
    settings = ServeSettings(policy=AbstentionPolicy(mode="escalate", threshold=1.0))
    with escalating(ScriptedModel(), large, settings, max_wait_ms=1) as srv:
        at_first, chunks = stream(srv.url, ask("unsure", stream=True), large)
    assert at_first < TOKENS // 2, at_first
    final = [c for ch in chunks for c in ch["choices"] if c.get("uncertainty")]
    assert final[0]["uncertainty"]["escalated"] is True


def test_the_hf_decoding_loop_streams_the_alternatives_of_its_whole_answer(tiny_llama):
    """The real decoding loop (a tiny random Llama, no weights read): the alternatives streamed
    with each token are the ones the non-streamed answer reports, token for token."""
    from gnll import load_model

    model = load_model(str(tiny_llama()), progress=False, chat_template=True)
    body = ask("What is the capital of France?", logprobs=True, top_logprobs=3, max_tokens=12)
    with ServerThread(build_inprocess_app(model, ServeSettings(), max_wait_ms=1)) as srv:
        whole = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120).json()
        with httpx.stream(
            "POST", srv.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120
        ) as r:
            chunks = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    entries = [
        e
        for ch in chunks
        for c in ch["choices"]
        for e in (c.get("logprobs") or {}).get("content") or []
    ]
    want = whole["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in entries] == [e["token"] for e in want] and want
    for got, exp in zip(entries, want, strict=True):
        assert [a["token"] for a in got["top_logprobs"]] == [
            a["token"] for a in exp["top_logprobs"]
        ]
        for a, b in zip(got["top_logprobs"], exp["top_logprobs"], strict=True):
            assert a["logprob"] == pytest.approx(b["logprob"], abs=BATCH_INVARIANCE_ATOL)
