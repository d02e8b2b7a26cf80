"""LlamaIndex: the LLM wrapper and the instrumentation handler, with the real `OpenAILike`, against
`gnll serve` on the embedded model and a recorded vLLM answer: every token kept, and the same G-NLL
as the server's `uncertainty.g_nll` for the same answer."""

from __future__ import annotations

import openai
import pytest
from integration_helpers import QUESTION, Recorder, proxy_record, require, vllm_and_proxy

require("llama_index.llms.openai_like")
from llama_index.core.instrumentation import get_dispatcher  # noqa: E402
from llama_index.core.llms import ChatMessage  # noqa: E402
from llama_index.llms.openai_like import OpenAILike  # noqa: E402

from gnll.integrations.llamaindex import UncertaintyEventHandler, with_uncertainty  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.server]
ASK = [ChatMessage(role="user", content=QUESTION)]


def llm(url, model="smollm2-135m-instruct", **kw):
    return OpenAILike(
        model=model, api_base=url + "/v1", api_key="x", is_chat_model=True, max_tokens=24, **kw
    )


@pytest.mark.model
def test_wrapper_keeps_every_token_and_matches_the_server(served):
    rec = Recorder()
    wrapped = with_uncertainty(llm(served.url, http_client=rec.client()), server="gnll")
    r = wrapped.chat(ASK)
    u = r.additional_kwargs["uncertainty"]
    ref = rec.records[-1]
    assert abs(u["g_nll"] - ref["g_nll"]) <= 1e-6 and u["num_tokens"] == ref["num_tokens"]  # same path: the server's record of the log-probs LlamaIndex re-reads
    # LlamaIndex's own list has one entry per position only because top_logprobs >= 1 was asked
    assert len(r.logprobs) == len(r.raw.choices[0].logprobs.content) == u["num_tokens"]
    chunks = list(wrapped.stream_chat(ASK))
    assert len(chunks) > 2
    u = chunks[-1].additional_kwargs["uncertainty"]
    assert abs(u["g_nll"] - rec.records[-1]["g_nll"]) <= 1e-6  # same path: the server's record of the log-probs LlamaIndex re-reads
    assert chunks[-1].message.content == r.message.content


@pytest.mark.model
def test_event_handler_observes_chat_and_stream(served):
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0)
    ref = (
        client.chat.completions.create(
            model="smollm2-135m-instruct",
            messages=[{"role": "user", "content": QUESTION}],
            max_tokens=24,
        )
        .choices[0]
        .uncertainty
    )
    handler = UncertaintyEventHandler(server="gnll")
    dispatcher = get_dispatcher()
    dispatcher.add_event_handler(handler)
    try:
        plain = llm(served.url, logprobs=True, top_logprobs=1, temperature=0)
        r = plain.chat(ASK)
        list(plain.stream_chat(ASK))
    finally:
        dispatcher.event_handlers.remove(handler)
    assert not handler.errors
    assert len(handler.records) == 2
    assert all(abs(x.g_nll - ref["g_nll"]) <= 1e-6 for x in handler.records)  # same path: the server's record of the log-probs LlamaIndex re-reads
    assert r.additional_kwargs["uncertainty"]["g_nll"] == handler.records[0].g_nll


def test_without_top_logprobs_llamaindex_drops_tokens_and_gnll_does_not():
    """The trap: `logprobs=True` alone gives empty `top_logprobs`, LlamaIndex's list loses every
    position; the wrapper asks for one alternative, and reads `raw` anyway."""
    with vllm_and_proxy() as (vllm, proxy, app):
        ref = proxy_record(proxy)
        wrapped = with_uncertainty(llm(vllm.url, model="served-model"), server="vllm")
        r = wrapped.chat(ASK)
        assert app.state.requests[-1]["top_logprobs"] >= 1
        assert abs(r.additional_kwargs["uncertainty"]["g_nll"] - ref["g_nll"]) <= 1e-6  # same path: the server's record of the log-probs LlamaIndex re-reads
        chunks = list(wrapped.stream_chat(ASK))
        assert abs(chunks[-1].additional_kwargs["uncertainty"]["g_nll"] - ref["g_nll"]) <= 1e-6  # same path: the server's record of the log-probs LlamaIndex re-reads
    from llama_index.llms.openai.utils import from_openai_token_logprobs
    from openai.types.chat import ChatCompletionTokenLogprob

    no_alternatives = [
        ChatCompletionTokenLogprob(token=t, logprob=-0.5, bytes=None, top_logprobs=[])
        for t in [" Paris", "\n"]
    ]
    assert from_openai_token_logprobs(no_alternatives) == []  # what gnll does not rely on
