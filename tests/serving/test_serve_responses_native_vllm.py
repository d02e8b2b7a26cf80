"""``/v1/responses`` through the proxy in front of a real vLLM server (its CPU build, the run's
shared ``vllm_server``): whole and streamed answers come from vLLM's own ``/v1/responses``, scored
from its ``output_text`` log-probs, and give the G-NLL of the same question translated to vLLM's
chat completions (a proxy told the upstream lacks the route) and of chat itself; the
``X-Gnll-Served-Via`` header names the route (:mod:`gnll.serving.native`)."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.serving import create_app
from gnll.serving.proxy import ProxyService
from gnll.serving.server import ServerThread

pytestmark = pytest.mark.vllm

SYSTEM = "Answer in one short sentence."
QUESTIONS = ["What is the capital of France?", "Who wrote Romeo and Juliet?"]


@pytest.fixture(scope="module")
def proxies(vllm_server):
    """A proxy that passes /v1/responses through, and one that translates it (as for an upstream
    without the route: its probe's answer set so)."""
    own = create_app(ProxyService(vllm_server.base_url, timeout=120))
    translating = create_app(ProxyService(vllm_server.base_url, timeout=120))
    translating.state.native_routes.known["/responses"] = False
    with ServerThread(own) as px, ServerThread(translating) as tx:
        yield vllm_server.model, px, tx


def streamed(srv, body: dict) -> tuple[str, list]:
    adapter = TypeAdapter(ResponseStreamEvent)
    with httpx.stream("POST", srv.url + "/v1/responses", json=body, timeout=120) as r:
        via = r.headers["x-gnll-served-via"]
        text = r.read().decode()
    events = [adapter.validate_json(x[6:]) for x in text.splitlines() if x.startswith("data: ")]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return via, events


@pytest.mark.parametrize("question", QUESTIONS)
def test_pass_through_and_translated_give_chats_g_nll(proxies, question):
    model, px, tx = proxies
    client = openai.OpenAI(base_url=px.url + "/v1", api_key="x", max_retries=0, timeout=120)
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        max_tokens=24,
        logprobs=True,
    ).choices[0]
    ask = dict(model=model, instructions=SYSTEM, input=question, max_output_tokens=24)

    # a whole answer: vLLM's own route, its log-probs asked for by the proxy and removed again
    raw = client.responses.with_raw_response.create(**ask)
    assert raw.headers["x-gnll-served-via"] == "responses"
    own = raw.parse()
    assert own.output_text == chat.message.content
    assert own.output[0].content[0].logprobs is None
    # ... or kept when asked for: they are vLLM's, token for token those of its chat route
    asked = client.responses.create(**ask, include=["message.output_text.logprobs"])
    lps = asked.output[0].content[0].logprobs
    chat_lps = chat.logprobs.content
    assert [lp.token for lp in lps] == [lp.token for lp in chat_lps]
    for a, b in zip(lps, chat_lps, strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=BATCH_INVARIANCE_ATOL)

    # a stream: vLLM's own events, relayed; the closing ones carry the record
    via, events = streamed(px, {**ask, "stream": True})
    assert via == "responses"
    assert all(not e.logprobs for e in events if e.type == "response.output_text.delta")
    own_stream = events[-1].response
    # (vLLM 0.32 names the last event response.completed even for a response it cut at
    # max_output_tokens; the response itself says incomplete, as the whole one does)
    assert own_stream.status == own.status and own_stream.output_text == own.output_text
    done = [e.item for e in events if e.type == "response.output_item.done"]
    with client.responses.stream(**ask) as stream:
        sdk = stream.get_final_response()
    assert sdk.output_text == own.output_text

    # translated to vLLM's chat completions, whole and streamed
    trans = httpx.post(tx.url + "/v1/responses", json=ask, timeout=120)
    assert trans.headers["x-gnll-served-via"] == "chat.completions"
    trans_items = trans.json()["output"]
    via, tevents = streamed(tx, {**ask, "stream": True})
    assert via == "chat.completions" and tevents[-1].response.output_text == own.output_text

    g = chat.uncertainty["g_nll"]
    n = chat.uncertainty["num_tokens"]
    assert n >= 3
    records = [
        *(item.uncertainty for item in (*own.output, *asked.output, *own_stream.output)),
        *(item.uncertainty for item in (*done, *sdk.output, *tevents[-1].response.output)),
        *(item["uncertainty"] for item in trans_items),
    ]
    for rec in records:
        assert rec["num_tokens"] == n
        assert rec["g_nll"] == pytest.approx(g, abs=BATCH_INVARIANCE_ATOL)
    print(
        f"{question!r} ({n} tokens): chat {g!r}; pass-through {own.output[0].uncertainty['g_nll']!r}, "
        f"streamed {own_stream.output[0].uncertainty['g_nll']!r}; translated "
        f"{trans_items[0]['uncertainty']['g_nll']!r}, streamed "
        f"{tevents[-1].response.output[0].uncertainty['g_nll']!r}; "
        f"max |d| {max(abs(r['g_nll'] - g) for r in records):.2e}"
    )
