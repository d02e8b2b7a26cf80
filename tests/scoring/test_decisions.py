"""``gnll.decide`` on a tiny random-weight model: exact option probabilities, refusals per question,
the first-token method, and ``/v1/decisions`` on the in-process app with the openai SDK."""

from __future__ import annotations

import math

import numpy as np
import pytest
from decision_helpers import INPUT, QUESTIONS

from gnll import load_model, score
from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.scoring.decisions import (
    DecisionError,
    answer_from_logprobs,
    decide,
    first_token_logprobs,
    parse_questions,
    question_messages,
)


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    return load_model(str(tiny_llama()), progress=False)


@pytest.fixture(scope="module")
def decided(tiny):
    return decide(tiny, INPUT, QUESTIONS)


def test_probabilities_sum_to_one_and_nlls_are_gnll_score(tiny, decided):
    qs = parse_questions(QUESTIONS)
    for q, a in zip(qs, decided.answers, strict=True):
        assert a.type == q.type
        p = np.array([o.probability for o in a.options])
        assert abs(p.sum() - 1.0) <= 1e-9  # same path: float64 normalisation
        assert 0 < a.mass <= 1
        # each option's NLL is what gnll.score gives that option as the answer to the same messages
        ref = score(
            tiny, [question_messages(INPUT, q)] * len(q.options), [o.text for o in q.options]
        )
        for o, r in zip(a.options, ref, strict=True):
            assert abs(o.nll - r.nll) <= BATCH_INVARIANCE_ATOL
            assert o.num_tokens == r.num_tokens
        # probabilities are the options' sequence probabilities renormalised
        lp = np.array([-r.nll for r in ref])
        expect = np.exp(lp - np.logaddexp.reduce(lp))
        assert np.allclose(p, expect, atol=1e-4)
    pred, choice, level = decided.answers
    assert pred.probability == pred.options[0].probability  # P(true)
    assert choice.choice == max(choice.options, key=lambda o: o.probability).value
    assert level.score == pytest.approx(sum(i * o.probability for i, o in enumerate(level.options)))


def test_multi_token_options_are_exact_not_first_token(tiny, decided):
    choice = decided.answers[1]
    delay, damage = choice.options[0], choice.options[1]
    assert delay.num_tokens > 1 and damage.num_tokens > 1
    # the two options share their first token(s) ...
    first = decide(tiny, INPUT, QUESTIONS, method="first-token").answers[1]
    assert first.method == "first-token"
    assert first.options[0].probability == first.options[1].probability
    # ... and only the whole-text probabilities tell them apart
    assert delay.probability != damage.probability
    assert abs(delay.logprob - damage.logprob) > 1e-3


def test_refusals_per_question_leave_the_others_answered(tiny, decided):
    questions = [
        QUESTIONS[0],
        {
            "type": "choice",
            "name": "picture",
            "instructions": [{"type": "input_image", "image_url": "https://example.com/a.png"}],
            "choices": [{"value": "cat"}, {"value": "dog"}],
        },
        {
            "type": "choice",
            "name": "alike",
            "instructions": "Which?",
            "choices": [{"value": "true"}, {"value": True}],  # distinct values, one text
        },
        QUESTIONS[2],
    ]
    d = decide(tiny, INPUT, questions)
    types = [a.type for a in d.answers]
    assert types == ["predicate", "refusal", "refusal", "score"]
    assert "image" in d.answers[1].reason and "'true'" in d.answers[2].reason
    # the answered ones are the same numbers as without the refused questions
    assert d.answers[0].probability == pytest.approx(decided.answers[0].probability, abs=1e-4)
    assert d.answers[3].score == pytest.approx(decided.answers[2].score, abs=1e-4)


def test_small_mass_is_a_refusal_with_its_reason(tiny, decided):
    mass = decided.answers[0].mass
    d = decide(tiny, INPUT, QUESTIONS[:1], min_mass=min(0.999, mass * 2))
    [a] = d.answers
    assert a.type == "refusal" and "cover" in a.reason
    assert a.mass == pytest.approx(mass, rel=1e-3)  # the numbers are kept, not silently dropped


def test_bad_requests_are_one_clear_error(tiny):
    with pytest.raises(DecisionError, match="choices"):
        decide(tiny, INPUT, [{"type": "choice", "instructions": "x", "choices": [{"value": "a"}]}])
    with pytest.raises(DecisionError, match="type"):
        decide(tiny, INPUT, [{"type": "essay", "instructions": "x"}])
    with pytest.raises(DecisionError, match="empty"):
        decide(tiny, "  ", QUESTIONS)


def test_non_finite_log_probs_refuse_never_a_number():
    [q] = parse_questions(QUESTIONS[:1])
    a = answer_from_logprobs(q, [-1.0, float("nan")])
    assert a.type == "refusal" and "'false'" in a.reason
    a = answer_from_logprobs(q, [-1.0, 0.5])
    assert a.type == "refusal"
    a = answer_from_logprobs(q, [-800.0, -801.0])  # far below float range: still exact in log space
    assert a.type == "predicate" and abs(a.probability - 1 / (1 + math.exp(-1))) < 1e-12  # same path: float64 closed form


def test_first_token_matching():
    lps, missing = first_token_logprobs(["yes", "no"], {"Yes": -0.1, " no": -2.0, "y": -3.0})
    assert lps == [-3.0, -2.0] and missing == []
    lps, missing = first_token_logprobs(["maybe"], {"no": -0.1})
    assert missing == ["maybe"] and math.isnan(lps[0])
