"""`/v1/responses` and `/v1/messages` through the proxy in front of a real vLLM server (its CPU
build, the run's shared ``vllm_server``): every body and event parses with the SDKs' own types,
the G-NLL equals chat's for the same question, and refuse leaks no byte of the refused answer."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.serving import AbstentionPolicy, ServeSettings, create_app
from gnll.serving.proxy import ProxyService
from gnll.serving.server import ServerThread

pytestmark = pytest.mark.vllm

QUESTION = "What is the capital of France?"
SYSTEM = "Answer in one short sentence."


@pytest.fixture(scope="module")
def proxies(vllm_server):
    """The proxy without a policy, and one that refuses every answer (threshold 1e-6)."""
    refuse = AbstentionPolicy(mode="refuse", threshold=1e-6, refusal="I do not know.")
    with (
        ServerThread(create_app(ProxyService(vllm_server.base_url, timeout=120))) as plain,
        ServerThread(
            create_app(
                ProxyService(vllm_server.base_url, timeout=120), ServeSettings(policy=refuse)
            )
        ) as refusing,
    ):
        yield vllm_server.model, plain, refusing


def _runs(types: list[str]) -> list[str]:
    """The event types with each run of one type written once."""
    return [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]


def test_the_sdks_parse_every_answer_and_event_with_chats_g_nll(proxies):
    model, px, _ = proxies
    oc = openai.OpenAI(base_url=px.url + "/v1", api_key="x", max_retries=0, timeout=120)
    chat = oc.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        max_tokens=16,
    ).choices[0]
    g = chat.uncertainty["g_nll"]
    ask = dict(model=model, instructions=SYSTEM, input=QUESTION, max_output_tokens=16)
    raw = httpx.post(px.url + "/v1/responses", json=ask, timeout=120)
    resp = Response.model_validate(raw.json())
    assert raw.headers["x-gnll-served-via"] == "responses"  # vLLM's own route (gnll.serving.native)
    assert resp.output_text == chat.message.content
    events = []
    with oc.responses.stream(**ask) as stream:
        for event in stream:
            events.append(event.type)
    adapter = TypeAdapter(ResponseStreamEvent)
    text = httpx.post(px.url + "/v1/responses", json={**ask, "stream": True}, timeout=120).text
    streamed = [
        adapter.validate_json(line[6:]) for line in text.splitlines() if line.startswith("data: ")
    ]
    # vLLM sends a text delta per batch of tokens its engine has ready, so how many deltas carry
    # the text depends on timing (one run 6, another 7 for the same answer): the same events but
    # for the number of deltas in a row, and the deltas spell the answer.
    assert _runs([e.type for e in streamed]) == _runs(events)
    final = streamed[-1].response
    assert final.output_text == chat.message.content
    deltas = [e.delta for e in streamed if e.type == "response.output_text.delta"]
    assert "".join(deltas) == final.output_text
    for item in (*resp.output, *final.output):
        assert item.uncertainty["g_nll"] == pytest.approx(g, abs=BATCH_INVARIANCE_ATOL)

    ac = anthropic.Anthropic(base_url=px.url, api_key="x", max_retries=0, timeout=120)
    margs = dict(
        model=model, system=SYSTEM, max_tokens=16, messages=[{"role": "user", "content": QUESTION}]
    )
    m = ac.messages.create(**margs)
    Message.model_validate(m.model_dump())
    assert m.content[0].text == chat.message.content
    assert m.uncertainty["g_nll"] == pytest.approx(g, abs=BATCH_INVARIANCE_ATOL)
    madapter = TypeAdapter(RawMessageStreamEvent)
    with ac.messages.stream(**margs) as stream:
        for event in stream:
            if event.type in (
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ):
                madapter.validate_python(event.model_dump())
            if event.type == "message_delta":
                assert event.uncertainty["g_nll"] == pytest.approx(g, abs=BATCH_INVARIANCE_ATOL)
        assert stream.get_final_message().content[0].text == chat.message.content


def test_refuse_leaks_no_byte_of_the_answer_on_either_api(proxies):
    model, px, refusing = proxies
    answer = (
        openai.OpenAI(base_url=px.url + "/v1", api_key="x", max_retries=0, timeout=120)
        .responses.create(model=model, input=QUESTION, max_output_tokens=16)
        .output_text
    )
    words = [w.strip(".,") for w in answer.split() if len(w.strip(".,")) > 3]
    assert words, answer
    bodies = [
        ("/v1/responses", {"model": model, "input": QUESTION, "max_output_tokens": 16}),
        (
            "/v1/messages",
            {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": QUESTION}]},
        ),
    ]
    for path, body in bodies:
        for stream in (False, True):
            r = httpx.post(refusing.url + path, json={**body, "stream": stream}, timeout=120)
            assert r.status_code == 200, r.text
            assert "I do not know." in r.text
            assert not [w for w in words if w in r.text], (words, r.text)
