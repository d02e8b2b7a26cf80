"""Every measure at finite extremes: finite, >= 0 and never -0.0, or a ValueError naming the bound."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnll import measures as M

# Finite log-probs over the whole float64 range (valid ones, above -9999, most often), zeros (both
# signs), tiny values and values just above the bound included.
logprob = st.one_of(
    st.floats(min_value=-9998.999, max_value=0.0, allow_nan=False),
    st.floats(min_value=-1.7976931348623157e308, max_value=0.0, allow_nan=False),
    st.sampled_from([0.0, -0.0, -1e-300, -5e-324, -9998.999999, -9999.0, -1e308]),
)
sequence = st.lists(logprob, max_size=6)


def _ok(value: float) -> None:
    assert isinstance(value, float)
    assert math.isfinite(value), value
    assert value >= 0.0, value
    assert math.copysign(1.0, value) == 1.0, "a measure returned -0.0"


def _check(fn, *args) -> None:
    try:
        value = fn(*args)
    except ValueError as exc:  # a token at the servers' -inf stand-in: the bound is named
        assert "at or below -9999" in str(exc), exc
        return
    _ok(value)


@settings(max_examples=300, deadline=None)
@given(sequence)
def test_single_sequence_measures_are_finite_and_never_negative_zero(seq):
    _check(M.g_nll, seq)
    _check(M.ln_g_nll, seq)


@settings(max_examples=300, deadline=None)
@given(st.lists(sequence, min_size=1, max_size=5), st.data())
def test_sample_measures_are_finite_and_never_negative_zero(seqs, data):
    ids = data.draw(st.lists(st.integers(0, 3), min_size=len(seqs), max_size=len(seqs)))
    for fn in (M.msp_estimate, M.predictive_entropy, M.ln_predictive_entropy):
        _check(fn, seqs)
    for fn in (
        M.semantic_entropy,
        M.ln_semantic_entropy,
        M.semantic_entropy_plugin,
        M.ln_semantic_entropy_plugin,
        M.max_cluster_probability,
    ):
        _check(fn, seqs, ids)
    _ok(M.discrete_semantic_entropy(ids))


@settings(max_examples=200, deadline=None)
@given(st.lists(sequence, min_size=1, max_size=5), st.data())
def test_cluster_log_probs_are_log_probabilities(seqs, data):
    ids = data.draw(st.lists(st.integers(0, 3), min_size=len(seqs), max_size=len(seqs)))
    try:
        log_p = M.cluster_log_probs(seqs, ids)
    except ValueError as exc:
        assert "at or below -9999" in str(exc)
        return
    assert all(math.isfinite(x) and x <= 0.0 for x in log_p)
    assert math.isclose(sum(math.exp(x) for x in log_p), 1.0, rel_tol=1e-9)


def test_extreme_log_probs_are_a_clear_error_naming_the_bound():
    # the review's inputs: inf / nan before, now a ValueError that names -9999
    with pytest.raises(ValueError, match="at or below -9999"):
        M.g_nll([-1e308, -1e308])
    with pytest.raises(ValueError, match=r"list_of_token_logprobs\[0\].*at or below -9999"):
        M.semantic_entropy([[-1e308, -1e308], [-1.0]], [0, 1])
    with pytest.raises(ValueError, match="at or below -9999"):
        M.max_cluster_probability([[-1e308], [-1e308]], [0, 1])


def test_valid_extremes_keep_their_values():
    # long answers of near-impossible tokens: the true values, not inf/nan/0
    big = [-9998.0] * 1000
    assert M.g_nll(big) == pytest.approx(9.998e6)
    assert M.semantic_entropy([big, big], [0, 1]) == pytest.approx(math.log(2))
    assert M.max_cluster_probability([big, [-9998.0] * 999 + [-9997.0]], [0, 1]) == pytest.approx(
        math.log(1 + math.e**-1), rel=1e-6
    )
    assert M.ln_g_nll(big) == pytest.approx(9998.0)
    assert M.predictive_entropy([big, big]) == pytest.approx(9.998e6)


@pytest.mark.parametrize(
    "value",
    [
        lambda: M.g_nll([]),
        lambda: M.g_nll([0.0]),
        lambda: M.g_nll([-0.0]),
        lambda: M.ln_g_nll([0.0]),
        lambda: M.msp_estimate([[0.0], [-1.0]]),
        lambda: M.predictive_entropy([[0.0]]),
        lambda: M.ln_predictive_entropy([[-0.0], []]),
        lambda: M.sequence_logprob([-0.0]),
    ],
)
def test_no_negative_zero(value):
    assert math.copysign(1.0, value()) == 1.0
