"""AbstentionPolicy.early_decision: the policies early decisions accept, refuse, and agree with."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnll._util.validation import ParameterError
from gnll.calibration import Calibrator
from gnll.measures import g_nll
from gnll.measures.early import EarlyDecisionError
from gnll.policy import AbstentionPolicy


def _calibrator(method: str, **kw) -> Calibrator:
    rng = np.random.default_rng(0)
    s = rng.gamma(2.0, 3.0, 300)
    y = rng.random(300) < 1 / (1 + np.exp(0.4 * (s - 6)))
    return Calibrator(method=method, cv=2, **kw).fit(s, y)


def test_threshold_policies_decide_early_under_refuse_and_escalate():
    for mode in ("refuse", "escalate"):
        rule = AbstentionPolicy(mode=mode, threshold=1.0).early_decision()
        rule.release([-0.6, -0.6])
        assert rule.decided and rule.decision.action == mode and rule.decision.at_token == 2


@pytest.mark.parametrize("mode", ["annotate", "flag"])
def test_policies_that_send_every_answer_are_refused(mode):
    with pytest.raises(EarlyDecisionError, match="use mode refuse or escalate"):
        AbstentionPolicy(mode=mode, threshold=1.0).early_decision()


def test_a_policy_without_a_threshold_is_refused():
    # refused when it is built (the policy checks itself), before an early decision is asked of it
    with pytest.raises(ParameterError, match="needs calibrator or threshold") as caught:
        AbstentionPolicy(mode="refuse")
    assert caught.value.param == "mode"


def test_non_monotone_calibrated_maps_are_refused_for_min_p_correct():
    cal = _calibrator("isotonic")
    cal.map_ = {"kind": "isotonic", "x": [0.0, 2.0, 4.0], "y": [0.9, 0.2, 0.6]}
    policy = AbstentionPolicy(mode="refuse", calibrator=cal, min_p_correct=0.5)
    with pytest.raises(EarlyDecisionError, match="not monotone"):
        policy.early_decision()
    cal.map_ = {"kind": "platt", "coef": 0.3, "intercept": 0.0}
    with pytest.raises(EarlyDecisionError, match="rises with G-NLL"):
        policy.early_decision()
    # A fitted rule answers G-NLL <= t whatever the map: monotone, so accepted.
    AbstentionPolicy(mode="refuse", calibrator=_calibrator("isotonic", target_coverage=0.7))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.floats(0.0, 4.0), min_size=1, max_size=20),
    st.floats(0.05, 0.95),
    st.sampled_from(["isotonic", "platt"]),
)
def test_calibrated_early_decision_equals_the_policys_end_decision(nlls, target, method):
    cal = _calibrator(method)
    policy = AbstentionPolicy(mode="escalate", calibrator=cal, min_p_correct=target)
    lps = [-x for x in nlls]
    rule = policy.early_decision()
    rule.release(lps)
    _, abstain = policy.decide(g_nll(lps))
    assert rule.decided == abstain
    if rule.decided:  # and at the first prefix the policy abstains on
        t = rule.decision.at_token
        assert policy.decide(g_nll(lps[:t]))[1]
        assert t == 0 or not policy.decide(g_nll(lps[: t - 1]))[1]
