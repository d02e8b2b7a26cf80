"""``/v1/responses`` through the proxy in front of a real vLLM server (its CPU build, the run's
shared ``vllm_server``): a whole answer comes from vLLM's own ``/v1/responses``, scored from its
``output_text`` log-probs; a stream is translated to vLLM's chat completions; the
``X-Gnll-Served-Via`` header names the route, and both give chat's G-NLL (:mod:`gnll.serving.native`)."""

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
def proxy(vllm_server):
    with ServerThread(create_app(ProxyService(vllm_server.base_url, timeout=120))) as px:
        yield vllm_server.model, px


@pytest.mark.parametrize("question", QUESTIONS)
def test_pass_through_and_translated_give_chats_g_nll(proxy, question):
    model, px = proxy
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

    # a stream: translated to vLLM's chat completions, and said so
    with httpx.stream(
        "POST", px.url + "/v1/responses", json={**ask, "stream": True}, timeout=120
    ) as r:
        assert r.headers["x-gnll-served-via"] == "chat.completions"
        text = r.read().decode()
    adapter = TypeAdapter(ResponseStreamEvent)
    events = [adapter.validate_json(x[6:]) for x in text.splitlines() if x.startswith("data: ")]
    final = events[-1].response
    assert events[-1].type == f"response.{own.status}" and final.output_text == own.output_text

    g = chat.uncertainty["g_nll"]
    n = chat.uncertainty["num_tokens"]
    assert n >= 3
    for item in (*own.output, *asked.output, *final.output):
        assert item.uncertainty["num_tokens"] == n
        # vLLM's numerics move by ~5e-6 per token between requests (batching, prefix cache)
        assert item.uncertainty["g_nll"] == pytest.approx(g, abs=BATCH_INVARIANCE_ATOL)
    print(
        f"{question!r}: chat {g!r}, pass-through {own.output[0].uncertainty['g_nll']!r}, "
        f"translated stream {final.output[0].uncertainty['g_nll']!r} ({n} tokens)"
    )
