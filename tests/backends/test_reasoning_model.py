"""A stand-in reasoning model on the embedded SmolLM2: a template that opens ``<think>``, a forced
short greedy trace, then the greedy answer. The proxy's split of a vLLM-shaped response built from
that model's own tokens equals the teacher-forced score of the answer given prompt + trace."""

from __future__ import annotations

import math

import openai
import pytest
from standin import StandIn

from gnll.backends.base import BATCH_INVARIANCE_ATOL, GenerationConfig
from gnll.backends.reasoning_model import ReasoningModel, trace_text
from gnll.serving import ServeSettings, create_app
from gnll.serving.proxy import ProxyService
from gnll.serving.server import ServerThread

QUESTION = "What is 2+2?"


def entries(tokens, logprobs):
    return [
        {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
        for t, lp in zip(tokens, logprobs, strict=True)
    ]


@pytest.mark.model
def test_proxy_split_equals_teacher_forced_answer_given_the_trace(smollm):
    rm = ReasoningModel(smollm, "think", trace_budget=12)
    config = GenerationConfig.greedy(max_new_tokens=8)
    [[g]] = rm.generate([QUESTION], config)
    s = g.reasoning
    assert s is not None and s.source == "generated" and s.trace_tokens >= 1
    assert g.text and g.token_logprobs
    [trace] = rm.traces([QUESTION])
    assert trace_text(trace) == s.trace_text  # greedy: the same trace again

    # The answer's G-NLL is its NLL given prompt + trace + marker, teacher-forced.
    head = rm.render_prompt(QUESTION)
    context = rm.context(QUESTION, s.trace_text)
    answer_text = "".join(g.tokens)
    [forced] = smollm.score([context], [answer_text], raw_prompt=True)
    assert forced.tokens == g.tokens
    assert forced.nll == pytest.approx(-g.logprob, abs=BATCH_INVARIANCE_ATOL)
    [via_score] = rm.score([QUESTION], [answer_text])
    assert via_score.nll == pytest.approx(forced.nll, abs=1e-9)  # same path: both teacher-force the same context and answer in one row

    # A vLLM-shaped response from the same tokens: trace, then "\n</think>\n\n" (its tokens and
    # log-probs teacher-forced after the trace), then the answer and its terminator.
    between = context[len(head) + len(s.trace_text) :]
    [mark] = smollm.score([head + s.trace_text], [between], raw_prompt=True)
    tokens = (
        trace.tokens
        + mark.tokens
        + g.tokens
        + smollm.tokenizer.batch_decode([[i] for i in g.terminator_token_ids])
    )
    lps = trace.token_logprobs + mark.token_logprobs + g.token_logprobs + g.terminator_logprobs
    assert "</think>" in "".join(mark.tokens)
    assert len(tokens) == len(lps), (trace, mark, g)
    response = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "standin-r1",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "reasoning": s.trace_text, "content": answer_text},
                "logprobs": {"content": entries(tokens, lps)},
                "finish_reason": "length" if g.finish_reason == "length" else "stop",
                "stop_reason": g.stop_sequence,
            }
        ],
    }

    def respond(method, path, body):
        if path.endswith("/models"):
            return 200, {"object": "list", "data": [{"id": "standin-r1", "owned_by": "vllm"}]}
        return 200, response

    with (
        StandIn(respond) as up,
        ServerThread(create_app(ProxyService(up.url, timeout=30), ServeSettings())) as srv,
    ):
        r = openai.OpenAI(
            base_url=srv.url + "/v1", api_key="x", max_retries=0
        ).chat.completions.create(
            model="standin-r1", messages=[{"role": "user", "content": QUESTION}]
        )
    u = r.choices[0].uncertainty
    assert abs(u["g_nll"] - forced.nll) <= BATCH_INVARIANCE_ATOL
    assert u["num_tokens"] == len(g.tokens)
    whole = -math.fsum(lps)
    assert whole - u["g_nll"] > 1e-3  # the trace is not in it
    # the proxy's trace: the reported tokens before the marker's (the "\n" before "</" included)
    assert u["trace_tokens"] >= len(trace.tokens)
    assert u["trace_nll"] == pytest.approx(-math.fsum(lps[: u["trace_tokens"]]), abs=1e-9)  # same path: float64 sums of the same log-probs
    assert u["split_at"] + u["answer_tokens"] == len(tokens)
