"""Exact early decisions (gnll.measures.early): the early decision equals the end-of-answer one.

The property test builds random answers as a decoding loop would produce them: a reasoning prefix
(tokens outside the answer), answer tokens with non-negative NLLs (some a hair above log-prob 0,
which the measures clamp), then tokens that turn out to be a stop string and are dropped, and a
stop token. Tokens are released in random bursts (a stop-string hold-back keeps some back for a
while); only released answer tokens are pushed. Thresholds are drawn from the answer's own prefix
sums, so equality with the threshold (``>`` against ``>=``) is hit on purpose.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnll.measures import g_nll
from gnll.measures.early import EarlyDecision, EarlyDecisionError, check_nonincreasing

nll = st.one_of(
    st.floats(0.0, 8.0, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, 0.25, 0.5, 1e-300, 0.1, 0.2, 0.3]),
)
# A log-prob a hair above 0 (round-off in a log-softmax) is clamped to 0 by every measure.
roundoff = st.floats(0.0, 1e-4, allow_nan=False)


@st.composite
def answers(draw):
    answer = [-x for x in draw(st.lists(nll, max_size=25))]
    for i in draw(st.lists(st.integers(0, 30), max_size=3)):
        if i < len(answer):
            answer[i] = draw(roundoff)  # positive round-off: clamped to 0
    reasoning = [-x for x in draw(st.lists(nll, max_size=6))]
    dropped = [-x for x in draw(st.lists(nll, max_size=4))]  # held back, then cut as a stop string
    stop_lp = -draw(nll)
    # Release schedule: after each generated answer token, how many answer tokens are released.
    released, r = [], 0
    for t in range(1, len(answer) + len(dropped) + 1):
        r = draw(st.integers(r, min(t, len(answer))))
        released.append(r)
    prefix_sums = [g_nll(answer[:k]) for k in range(len(answer) + 1)]
    tau = draw(st.one_of(st.sampled_from(prefix_sums), st.floats(0.0, 60.0)))
    if draw(st.booleans()):  # the same value a hair below/above
        tau = math.nextafter(tau, draw(st.sampled_from([-math.inf, math.inf])))
    strict = draw(st.booleans())
    return reasoning, answer, dropped, stop_lp, released, tau, strict


def _replay(reasoning, answer, dropped, released, rule):
    """Push the stream as a decoding loop would; the decision after each generated token."""
    states = []
    for lp in reasoning:
        states.append((0, rule.push(lp, answer=False)))
    pushed = 0
    for r in released:
        rule.skip()  # the generated token (answer or stop-string text), held until released
        rule.release(answer[pushed:r])
        pushed = r
        states.append((pushed, rule.decision))
    # The stop token ends the answer: what is held is cut (the dropped stop string) or released.
    rule.skip()
    rule.release(answer[pushed:])
    states.append((len(answer), rule.decision))
    return states


@settings(max_examples=600, deadline=None)
@given(answers())
def test_early_decision_equals_end_decision_and_is_never_premature(case):
    reasoning, answer, dropped, stop_lp, released, tau, strict = case

    def abstains(g: float) -> bool:
        return g >= tau if strict else g > tau

    rule = EarlyDecision(abstains, action="escalate")
    states = _replay(reasoning, answer, dropped, released, rule)
    end = EarlyDecision(abstains, action="escalate").finish(answer, stop_lp)

    # The end-of-answer decision is the policy's decision on the whole answer's G-NLL, with the
    # empty-answer rule (an empty answer is scored by its stop token).
    measured = answer if answer else [stop_lp]
    assert end.g_nll == g_nll(measured)
    assert end.abstain == abstains(g_nll(measured))

    early = rule.decision
    if early.state == "decided":
        # Exact: never a decision the finished answer does not get.
        assert end.state == "decided" and end.action == early.action
        assert early.g_nll <= end.g_nll
        t = early.at_token
        # Made on released answer tokens only, at the first prefix that abstains.
        assert early.g_nll == g_nll(answer[:t])
        assert abstains(g_nll(answer[:t]))
        assert t == 0 or not abstains(g_nll(answer[: t - 1]))
    elif answer:
        # Undecided after the whole answer was released: the end accepts it.
        assert end.state == "accepted"
    # Never premature: at every step the rule is decided exactly when the released prefix abstains.
    for pushed, d in states:
        assert (d.state == "decided") == abstains(g_nll(answer[:pushed]))


@settings(max_examples=200, deadline=None)
@given(st.lists(nll, min_size=1, max_size=40), st.lists(nll, min_size=1, max_size=40))
def test_running_gnll_never_exceeds_the_final_one_to_the_last_bit(head, tail):
    """fsum is correctly rounded: a prefix's G-NLL is <= the whole answer's (pairwise sums are not)."""
    lps = [-x for x in head + tail]
    assert g_nll(lps[: len(head)]) <= g_nll(lps)


# Found by search: NumPy's pairwise sum of these puts the first 25 tokens' NLL (12.124576489442557)
# above the whole answer's (12.124576489442555), because the two sums are grouped differently.
PAIRWISE_TRAP = [
    -0.7320061956565608, -0.6143732469489966, -0.028365365113521057, -0.7192197728267403,
    -0.015991729523571974, -0.7579510023564281, -0.512758723262078, -0.9291042207970062,
    -0.06608249672407474, -0.8413172796123832, -0.0666900087671014, -0.34430997880412517,
    -0.4302987319478333, -0.9660620807840702, -0.562231842228457, -0.25886459317093224,
    -0.24167571409434496, -0.8881183206591798, -0.22586942841732438, -0.1245547058352835,
    -0.2883307570075776, -0.5861230648127328, -0.5540905021732678, -0.8097107759127777,
    -0.5604759520061858, 0.0, -4.128963426808928e-18, 0.0, -6.2650646241975355e-18, 0.0, 0.0,
    0.0, 0.0, 0.0, -1.4547353818653175e-18, -4.065103367481267e-18, 0.0,
]  # fmt: skip


def test_the_running_sum_is_correctly_rounded_where_a_pairwise_sum_is_not():
    head, whole = np.asarray(PAIRWISE_TRAP[:25]), np.asarray(PAIRWISE_TRAP)
    tau = float(-whole.sum())
    assert -head.sum() > tau  # a pairwise running sum would refuse an answer the end accepts
    rule = EarlyDecision(lambda g: g > tau)
    rule.release(PAIRWISE_TRAP)
    assert rule.decided == (rule.finish(PAIRWISE_TRAP).state == "decided")
    assert g_nll(PAIRWISE_TRAP[:25]) <= g_nll(PAIRWISE_TRAP)


def test_empty_answer_is_decided_by_its_stop_token_at_the_end():
    rule = EarlyDecision(lambda g: g > 1.0)
    assert rule.decision.state == "undecided"  # nothing released: G-NLL 0 does not abstain
    assert rule.finish([], stop_logprob=-2.0).state == "decided"
    assert rule.finish([], stop_logprob=-0.5).state == "accepted"
    with pytest.raises(ValueError, match="empty"):
        rule.finish([])


def test_a_policy_that_abstains_at_zero_is_decided_before_the_first_token():
    rule = EarlyDecision(lambda g: g >= 0.0)
    assert rule.decided and rule.decision.at_token == 0


def test_threshold_equality_follows_the_policys_own_comparison():
    lps = [-0.5, -0.5]
    strict = EarlyDecision(lambda g: g > 1.0)
    strict.release(lps)
    assert not strict.decided  # G-NLL == 1.0 is answered under "> 1"
    loose = EarlyDecision(lambda g: g >= 1.0)
    loose.release(lps)
    assert loose.decided and loose.decision.at_token == 2


def test_decided_stays_decided_and_counts_generated_tokens():
    rule = EarlyDecision(lambda g: g > 0.4, action="refuse")
    rule.push(-1.0, answer=False)
    rule.push(-0.5)
    rule.push(-0.0)
    assert rule.decision.at_token == 1 and rule.decision.generated == 2
    assert rule.generated == 3


def test_positive_roundoff_is_clamped_and_bad_logprobs_are_refused():
    rule = EarlyDecision(lambda g: g > 0.0)
    rule.push(5e-6)
    assert not rule.decided and rule.decision.g_nll == 0.0
    with pytest.raises(ValueError, match="non-finite"):
        rule.push(float("nan"))
    with pytest.raises(ValueError, match="-9999"):
        rule.push(-9999.0)


def test_non_monotone_measures_and_maps_are_refused():
    with pytest.raises(EarlyDecisionError, match="ln-g-nll"):
        EarlyDecision(lambda g: g > 1, measure="ln-g-nll")
    with pytest.raises(EarlyDecisionError, match="not monotone"):
        check_nonincreasing([0, 1, 2], [0.9, 0.4, 0.5], what="map")
    with pytest.raises(EarlyDecisionError, match="not sorted"):
        check_nonincreasing([0, 2, 1], [0.9, 0.4, 0.3], what="map")
    check_nonincreasing(np.arange(3.0), [0.9, 0.9, 0.1], what="map")
