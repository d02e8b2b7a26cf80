"""Exact early decisions for a reasoning model run in-process (``ReasoningModel``): the trace and
the end-of-reasoning marker are context, only the answer's released tokens count, the trace is
never cut, and the answer stops at its decision with the same decision as waiting for its end.

The fast tests run the real engine and app around a stand-in whose traces are :data:`THOUGHTS`
(NLL 30, past every threshold here: a decision that counted the trace would be made inside it);
the model test wraps SmolLM2 as a reasoning model.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from serve_helpers import (
    LONG,
    THOUGHTS,
    ScriptedModel,
    Thinker,
    ask,
    check_refused_early,
    escalating,
    serve,
)

from gnll.backends.base import GenerationConfig
from gnll.backends.early import EarlyDecided
from gnll.backends.reasoning_model import ReasoningModel
from gnll.measures import g_nll
from gnll.serving import AbstentionPolicy, ServeSettings
from gnll.serving.engine import BatchingEngine

TRACE_TOKENS = len(THOUGHTS[0]) + 1  # the trace's tokens and the EOS that ended it


def test_a_reasoning_models_answer_stops_at_the_decision_after_its_whole_trace():
    runs = {}
    for early in (True, False):
        thinker = Thinker()
        policy = AbstentionPolicy(mode="refuse", threshold=3.0)
        with serve(ReasoningModel(thinker), policy=policy, early=early) as s:
            runs[early] = ask(s, "long"), thinker.generated
    (on, made_on), (off, made_off) = runs[True], runs[False]
    # The answer is LONG (log-prob -0.5 a token): its G-NLL passes 3.0 at its 7th token. Had the
    # trace counted (NLL 1 a token), the decision would have been made at the trace's 4th token.
    u_on, u_off = check_refused_early(on, off)
    # Answer tokens: generated 7 of max_tokens 100; the trace ran to its end both ways.
    assert (u_on["tokens_generated"], u_on["tokens_saved"]) == (7, 93)
    assert u_on["trace_tokens"] == u_off["trace_tokens"] == len(THOUGHTS[0])
    assert u_on["trace_nll"] == u_off["trace_nll"] == pytest.approx(30.0)
    assert made_on == TRACE_TOKENS + 7 and made_off == TRACE_TOKENS + 100
    assert u_off["g_nll"] == g_nll(LONG[1][:100]) and "early" not in u_off
    assert u_on["g_nll"] <= u_off["g_nll"]


def test_a_trace_past_the_threshold_does_not_decide_a_sure_answer():
    thinker = Thinker()
    policy = AbstentionPolicy(mode="refuse", threshold=3.0)
    with serve(ReasoningModel(thinker), policy=policy) as s:
        c = ask(s, "capital?")
    u = c["uncertainty"]
    assert c["text"] == "Paris." and u["abstain"] is False and "early" not in u
    assert u["g_nll"] == pytest.approx(0.03)  # the answer's, not the trace's 30
    assert u["trace_tokens"] == len(THOUGHTS[0])


def test_escalation_of_a_reasoning_models_answer_starts_at_its_decision():
    thinker = Thinker()
    settings = ServeSettings(policy=AbstentionPolicy(mode="escalate", threshold=2.0))
    small = ReasoningModel(thinker)
    with escalating(small, ScriptedModel(), settings, escalate_model="scripted") as s:
        c = ask(s, "long")
    u = c["uncertainty"]
    assert u["escalated"] is True and u["local"]["early"] is True
    assert u["local"]["decided_at_token"] == 5 and thinker.generated == TRACE_TOKENS + 5
    assert u["local"]["text"] == " w0 w1 w2 w3 w4"


def test_one_loop_decodes_the_answers_and_frees_a_decided_answers_slot():
    """``BatchingEngine.run`` (``gnll generate``'s path) with one answer slot: the refused answer
    stops at its decision and the next answer takes the slot at the next step."""
    thinker = Thinker()
    engine = BatchingEngine(ReasoningModel(thinker), max_batch_prompts=1)
    policy = AbstentionPolicy(mode="refuse", threshold=3.0)
    config = GenerationConfig.greedy(max_new_tokens=100)
    out = engine.run(["long", "capital?"], config, early=policy.early_decision)
    [[stopped], [kept]] = out.generations
    assert [g.early for [g] in out.generations] == [
        EarlyDecided(decided_at_token=7, tokens_generated=7, tokens_saved=93, action="refuse"),
        None,
    ]
    assert stopped.finish_reason == "decided" and stopped.tokens == LONG[0][:7]
    assert stopped.reasoning is not None and stopped.reasoning.trace_tokens == len(THOUGHTS[0])
    assert kept.text == "Paris." and kept.reasoning is not None
    # The answer phase, one slot: 7 steps of "long", then "capital?" ("Paris", ".", EOS).
    answer_steps = [tags for tags in thinker.steps if len(tags) == 1][-(7 + 3) :]
    assert len({tags[0] for tags in answer_steps[:7]}) == 1
    assert answer_steps[7][0] != answer_steps[6][0]
    assert len(thinker.steps) == TRACE_TOKENS + 7 + 3  # the traces (together), then the answers


def test_a_stopped_answer_is_a_prefix_of_the_full_one():
    config = GenerationConfig.greedy(max_new_tokens=60)
    policy = AbstentionPolicy(mode="refuse", threshold=4.2)
    on = BatchingEngine(ReasoningModel(Thinker())).run(
        ["long"], config, early=policy.early_decision
    )
    off = BatchingEngine(ReasoningModel(Thinker())).run(["long"], config)
    [[e]], [[f]] = on.generations, off.generations
    k = len(e.token_ids)
    assert 0 < k < len(f.token_ids) and e.token_ids == f.token_ids[:k]
    assert e.token_logprobs == f.token_logprobs[:k]
    assert g_nll(e.token_logprobs) <= g_nll(f.token_logprobs)
    assert e.reasoning.trace_text == f.reasoning.trace_text  # the same whole trace
    assert [g.early for [g] in off.generations] == [None]


@pytest.mark.model
def test_smollm_as_a_reasoning_model_same_decisions_with_and_without_early_stopping(smollm):
    """SmolLM2 wrapped as a reasoning model (a short forced trace), six questions asked for long
    answers through ``gnll serve``: the same refusals both ways; the early ones stop within the
    full answer, their G-NLL a lower bound of its, after the same trace."""
    questions = [
        "Tell me about the history of Rome.",
        "What is the capital of France?",
        "Describe how a steam engine works.",
        "Who wrote Moby-Dick?",
        "Explain photosynthesis.",
        "What is 2+2?",
    ]
    model = ReasoningModel(smollm, "think", trace_budget=16)
    out = {}
    for early in (True, False):
        with serve(model, policy=AbstentionPolicy(mode="refuse", threshold=6.0), early=early) as s:
            out[early] = [ask(s, q, max_tokens=40)["uncertainty"] for q in questions]
    saved = 0
    for on, off in zip(out[True], out[False], strict=True):
        assert on["abstain"] == off["abstain"]
        assert on["trace_tokens"] == off["trace_tokens"]
        assert on["trace_nll"] == pytest.approx(off["trace_nll"], abs=1e-4)
        if on.get("early"):
            assert on["g_nll"] <= off["g_nll"] + 1e-6 and on["g_nll"] > 6.0
            # generated: the released answer tokens and any held back for a stop string
            assert on["decided_at_token"] <= on["tokens_generated"]
            assert on["tokens_generated"] + on["tokens_saved"] == 40
            assert on["decided_at_token"] <= off["num_tokens"]
            saved += off["num_tokens"] - on["tokens_generated"]
        else:
            assert on["g_nll"] == pytest.approx(off["g_nll"], abs=1e-4)
    assert any(u.get("early") for u in out[True]) and saved > 0


@settings(max_examples=25)
@given(
    threshold=st.floats(0.0, 40.0, allow_nan=False),
    question=st.sampled_from(["long", "unsure", "capital?"]),
)
def test_early_and_end_of_answer_decisions_agree_at_any_threshold(threshold, question):
    """Whatever the threshold (the trace's NLL, 30, is past most of them): the early decision is
    the end-of-answer one, made on an answer token, never before the first, and the stopped
    answer is the full answer's prefix."""
    policy = AbstentionPolicy(mode="refuse", threshold=threshold)
    config = GenerationConfig.greedy(max_new_tokens=60)
    on = BatchingEngine(ReasoningModel(Thinker())).run(
        [question], config, early=policy.early_decision
    )
    off = BatchingEngine(ReasoningModel(Thinker())).run([question], config)
    [[e]], [[f]] = on.generations, off.generations
    refused_at_end = policy.decide(g_nll(f.token_logprobs))[1]
    facts = e.early
    if facts is None:
        assert not refused_at_end and e.token_ids == f.token_ids
    else:
        assert refused_at_end and facts.action == "refuse"
        k = facts.decided_at_token
        assert 1 <= k <= len(f.token_ids) and e.token_ids == f.token_ids[:k]
        assert g_nll(f.token_logprobs[: k - 1]) <= threshold < g_nll(f.token_logprobs[:k])
    assert e.reasoning.trace_tokens == f.reasoning.trace_tokens == len(THOUGHTS[0])
