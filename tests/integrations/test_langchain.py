"""LangChain: `with_uncertainty(ChatOpenAI(...))` and the callback handler, with the real packages,
against `gnll serve` on the embedded model and a recorded vLLM upstream: the adapter's G-NLL is the
server's `uncertainty.g_nll` for the same answer, through invoke, batch, stream and astream."""

from __future__ import annotations

import asyncio

import pytest
from integration_helpers import QUESTION, Recorder, proxy_record, require, vllm_and_proxy

from gnll.integrations.core import ReasoningTokensError

require("langchain_openai")
from langchain_openai import ChatOpenAI  # noqa: E402

from gnll.integrations.langchain import UncertaintyCallbackHandler, with_uncertainty  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.server]
QUESTIONS = [QUESTION, "Who wrote Romeo and Juliet?", "How many legs does a spider have?"]


def server_g_nll(srv, question, **kw):
    r = srv.client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=[{"role": "user", "content": question}],
        max_tokens=24,
        **kw,
    )
    return r.choices[0].message.content, r.choices[0].uncertainty


def chat(url, model="smollm2-135m-instruct", **kw):
    return ChatOpenAI(base_url=url + "/v1", api_key="x", model=model, max_tokens=24, **kw)


@pytest.mark.model
def test_invoke_batch_stream_astream_match_the_server(served):
    """Each answer's G-NLL from the log-probs LangChain kept equals the `uncertainty.g_nll` the
    server put on that very response (which ChatOpenAI drops)."""
    rec = Recorder()
    llm = with_uncertainty(
        chat(served.url, http_client=rec.client(), http_async_client=rec.async_client()),
        server="gnll",
    )
    got = [llm.invoke(QUESTIONS[0]), *llm.batch(QUESTIONS)]
    chunks = list(llm.stream(QUESTIONS[1]))
    assert len(chunks) > 2  # streamed, then one closing chunk
    got.append(sum(chunks[1:], chunks[0]))

    async def both():
        achunks = [c async for c in llm.astream(QUESTIONS[2])]
        return [sum(achunks[1:], achunks[0]), await llm.ainvoke(QUESTIONS[2])]

    got += asyncio.run(both())
    assert len(rec.records) == len(got) == 7
    # batch() sends its requests at once: their responses arrive in any order, so a message that
    # kept its response id (not a streamed one) is matched with the record of that response; the
    # other requests run one after another, and their records come in the order of `got`.
    by_id = dict(zip(rec.ids, rec.records, strict=True))
    assert len(by_id) == 7
    for i, message in enumerate(got):
        rid = message.response_metadata.get("id")
        ref = by_id[rid] if rid is not None else rec.records[i]
        u = message.response_metadata["uncertainty"]
        assert abs(u["g_nll"] - ref["g_nll"]) <= 1e-6  # same path: the server's record of the log-probs the framework re-reads
        assert abs(u["ln_g_nll"] - ref["ln_g_nll"]) <= 1e-6  # same path: the server's record of the log-probs the framework re-reads
        assert u["num_tokens"] == ref["num_tokens"] and u["decoding"] == "greedy"
        assert u["spans"] == ref["spans"]
    # and the same answers as asking the server directly (greedy was pinned)
    text, _ = server_g_nll(served, QUESTIONS[0])
    assert got[0].content == got[1].content == text


@pytest.mark.model
def test_refuse_and_flag_policies(served):
    text, ref = server_g_nll(served, QUESTION)
    below = ref["g_nll"] / 2  # this answer is above the threshold
    refused = with_uncertainty(chat(served.url), server="gnll", policy="refuse", threshold=below)
    m = refused.invoke(QUESTION)
    assert m.content == "I am not confident enough to answer this." != text
    assert m.response_metadata["uncertainty"]["refused"] is True
    assert "logprobs" not in m.response_metadata
    assert [c.content for c in refused.stream(QUESTION)] == [m.content]  # nothing of it leaked
    flagged = with_uncertainty(chat(served.url), server="gnll", policy="flag", threshold=below)
    m = flagged.invoke(QUESTION)
    assert m.content == text and m.response_metadata["uncertainty"]["abstain"] is True


@pytest.mark.model
def test_callback_handler_observes_the_same_number(served):
    _, ref = server_g_nll(served, QUESTION)
    seen = []
    handler = UncertaintyCallbackHandler(lambda rec, run_id: seen.append(rec), server="gnll")
    llm = chat(served.url, logprobs=True, top_logprobs=1, temperature=0, callbacks=[handler])
    llm.invoke(QUESTION)
    list(llm.stream(QUESTION))
    assert not handler.errors
    assert len(seen) == 2 and all(abs(r.g_nll - ref["g_nll"]) <= 1e-6 for r in seen)  # same path: the server's record of the log-probs the framework re-reads


def test_recorded_vllm_answer_matches_gnll_serve_upstream():
    with vllm_and_proxy() as (vllm, proxy, app):
        ref = proxy_record(proxy)
        llm = with_uncertainty(chat(vllm.url), server="vllm")
        m = llm.invoke(QUESTION)
        assert abs(m.response_metadata["uncertainty"]["g_nll"] - ref["g_nll"]) <= 1e-6  # same path: the server's record of the log-probs the framework re-reads
        assert m.response_metadata["uncertainty"]["num_tokens"] == ref["num_tokens"] == 1
        chunks = list(llm.stream(QUESTION))
        assert abs(chunks[-1].response_metadata["uncertainty"]["g_nll"] - ref["g_nll"]) <= 1e-6  # same path: the server's record of the log-probs the framework re-reads
        sent = app.state.requests[-1]  # what the adapter asked vLLM for
        assert sent["logprobs"] is True and sent["top_logprobs"] >= 1
        assert sent["temperature"] == 0


def test_reasoning_trace_in_the_log_probs_is_split_at_its_marker_or_refused_clearly():
    """LangChain keeps a reasoning trace's log-probs but not its text: with the end-of-reasoning
    marker among them the answer is what follows it; without one, no silent wrong number."""
    from langchain_core.messages import AIMessage

    llm = with_uncertainty(chat("http://127.0.0.1:9"), server="vllm")

    def message(tokens):
        return AIMessage(
            content="Paris",
            response_metadata={
                "finish_reason": "stop",
                "logprobs": {"content": [{"token": t, "logprob": -0.5} for t in tokens]},
            },
        )

    u = llm.score(message(["Let", " me", " think", ".", "</think>", "Paris"])).uncertainty.to_json()
    assert u["g_nll"] == pytest.approx(0.5) and u["scored"] == "answer"
    assert (u["trace_tokens"], u["marker_tokens"], u["trace_nll"]) == (4, 1, pytest.approx(2.0))
    with pytest.raises(ReasoningTokensError, match="reasoning model's trace"):
        llm.score(message(["Let", " me", " think", ".", "Paris"]))


@pytest.mark.model
def test_openai_decisions_get_gnll_exact_probabilities(served, smollm):
    """LangChain's `OpenAIDecisions` (invoke and ainvoke) against `gnll serve`: the answers are
    `gnll.decide`'s exact option probabilities."""
    from langchain_openai.decisions import Choice, OpenAIDecisions, Predicate, Score

    from gnll import decide

    text = "The parcel arrived two weeks late and the box was crushed."
    request = {
        "input": text,
        "questions": {
            "late": Predicate(instructions="Was the parcel late?"),
            "topic": Choice(
                instructions="What is the message about?",
                choices={"delivery delay": None, "delivery damage": None, "billing": None},
            ),
            "anger": Score(instructions="How angry is the writer?", levels=["Calm", "Furious"]),
        },
    }
    runnable = OpenAIDecisions(
        model="smollm2-135m-instruct", base_url=served.url + "/v1", api_key="x"
    )
    ref = decide(smollm, text, [q._to_api(name) for name, q in request["questions"].items()])
    late, topic, anger = ref.answers
    for got in (runnable.invoke(request), asyncio.run(runnable.ainvoke(request))):
        assert got.predicates["late"].probability == pytest.approx(late.probability, abs=1e-4)
        probs = got.choices["topic"].probabilities
        for o in topic.options:
            assert probs[o.value] == pytest.approx(o.probability, abs=1e-4)
        assert got.choices["topic"].choice == topic.choice
        assert got.scores["anger"].score == pytest.approx(anger.score, abs=1e-4)
        assert got.scores["anger"].legend == {0: "Calm", 1: "Furious"}
