"""Measures against hand-computed values and their defining properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnll import measures as M

logprob = st.floats(min_value=-20.0, max_value=0.0, allow_nan=False)
sequence = st.lists(logprob, min_size=1, max_size=8)
samples = st.lists(sequence, min_size=1, max_size=8)


def test_hand_computed_values():
    assert M.g_nll([-0.5, -0.25]) == pytest.approx(0.75)
    assert M.ln_g_nll([-0.5, -0.25]) == pytest.approx(0.375)
    assert M.msp_estimate([[-0.5, -0.25], [-0.1], [-3.0]]) == pytest.approx(0.1)
    assert M.predictive_entropy([[-1.0, -1.0], [-0.5]]) == pytest.approx(1.25)
    assert M.ln_predictive_entropy([[-1.0, -1.0], [-0.5]]) == pytest.approx(0.75)
    # Two clusters: masses exp(-1)+exp(-2) and exp(-1), normalised.
    lps = [[-1.0], [-2.0], [-1.0]]
    a, b = math.exp(-1) + math.exp(-2), math.exp(-1)
    pa, pb = a / (a + b), b / (a + b)
    # plug-in form: -sum_c p(c) log p(c); the paper's Monte-Carlo form: mean of -log p(c_n)
    assert M.semantic_entropy_plugin(lps, [0, 0, 1]) == pytest.approx(
        -(pa * math.log(pa) + pb * math.log(pb))
    )
    assert M.semantic_entropy(lps, [0, 0, 1]) == pytest.approx(
        -(2 * math.log(pa) + math.log(pb)) / 3
    )
    assert M.max_cluster_probability(lps, [0, 0, 1]) == pytest.approx(-math.log(pa))
    assert M.discrete_semantic_entropy([0, 0, 1]) == pytest.approx(
        -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3))
    )
    # LN-SE uses per-token means: [-1, -3] -> -2, [-2] -> -2: equal masses.
    assert M.ln_semantic_entropy([[-1.0, -3.0], [-2.0]], [0, 1]) == pytest.approx(math.log(2))
    assert M.ln_semantic_entropy_plugin([[-1.0, -3.0], [-2.0]], [0, 1]) == pytest.approx(
        math.log(2)
    )


def test_semantic_entropy_forms_differ_on_few_samples():
    """The review's example: 6 samples hold 90% of the mass, 4 samples 10%."""
    lps = [[math.log(0.9 / 6)]] * 6 + [[math.log(0.1 / 4)]] * 4
    ids = [0] * 6 + [1] * 4
    plug_in = -(0.9 * math.log(0.9) + 0.1 * math.log(0.1))
    monte_carlo = -(0.6 * math.log(0.9) + 0.4 * math.log(0.1))
    assert (round(plug_in, 3), round(monte_carlo, 3)) == (0.325, 0.984)
    assert M.semantic_entropy_plugin(lps, ids) == pytest.approx(plug_in)
    assert M.semantic_entropy(lps, ids) == pytest.approx(monte_carlo)
    # cluster ids need not be 0..k-1 nor sorted
    assert M.semantic_entropy(lps, [7] * 6 + [-2] * 4) == pytest.approx(monte_carlo)
    # length normalisation: two-token answers, per-token means give the same masses
    lps2 = [[x[0] / 2, x[0] / 2] for x in lps]
    assert M.semantic_entropy(lps2, ids) == pytest.approx(monte_carlo)
    assert M.ln_semantic_entropy(lps2, ids) != pytest.approx(monte_carlo)
    assert M.get("se").label == "SE" and M.get("se-rb").label == "SE-RB"


def test_empty_answer_is_legal():
    assert M.g_nll([]) == 0.0
    assert M.ln_g_nll([]) == 0.0
    assert M.predictive_entropy([[], [-1.0]]) == pytest.approx(0.5)
    assert M.ln_predictive_entropy([[], [-1.0]]) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([-0.1, float("nan")], "non-finite"),
        ([-0.1, float("-inf")], "non-finite"),
        ([0.3], "positive log-probability"),
        ([[-0.1], [-0.2]], "one-dimensional"),
        ("abc", "string"),
    ],
)
def test_invalid_token_logprobs_raise(bad, message):
    with pytest.raises((ValueError, TypeError), match=message):
        M.g_nll(bad)


def test_invalid_batches_and_clusters_raise():
    with pytest.raises(ValueError, match="empty"):
        M.predictive_entropy([])
    with pytest.raises(ValueError, match="flat array"):
        M.predictive_entropy(np.array([-0.1, -0.2]))
    with pytest.raises(ValueError, match="one cluster id per output"):
        M.semantic_entropy([[-1.0], [-1.0]], [0])
    with pytest.raises(ValueError, match="integers"):
        M.semantic_entropy([[-1.0], [-1.0]], [0.0, 1.0])
    with pytest.raises(ValueError, match=r"list_of_token_logprobs\[1\]"):
        M.msp_estimate([[-1.0], [float("nan")]])


def test_round_off_above_zero_is_tolerated():
    assert M.g_nll([1e-7, -0.5]) == pytest.approx(0.5)


@given(sequence)
def test_g_nll_nonnegative_and_minus_log_product(seq):
    value = M.g_nll(seq)
    assert value >= 0
    # At most 8 tokens >= -20 each: the product stays far above float underflow.
    assert value == pytest.approx(-math.log(math.prod(math.exp(x) for x in seq)))


@given(samples)
def test_msp_estimate_is_at_most_every_sample_nll(seqs):
    msp = M.msp_estimate(seqs)
    assert all(msp <= M.g_nll(s) + 1e-12 for s in seqs)
    assert msp <= M.predictive_entropy(seqs) + 1e-9


@given(samples)
def test_one_cluster_has_zero_semantic_entropy(seqs):
    ids = [0] * len(seqs)
    assert M.semantic_entropy(seqs, ids) == pytest.approx(0.0, abs=1e-12)  # same path: float64 closed form
    assert M.ln_semantic_entropy(seqs, ids) == pytest.approx(0.0, abs=1e-12)  # same path: float64 closed form
    assert M.max_cluster_probability(seqs, ids) == pytest.approx(0.0, abs=1e-12)  # same path: float64 closed form
    assert M.discrete_semantic_entropy(ids) == 0.0


@given(st.integers(min_value=1, max_value=50))
def test_singleton_clusters_discrete_se_is_log_n(n):
    assert M.discrete_semantic_entropy(list(range(n))) == pytest.approx(math.log(n))


@settings(max_examples=50)
@given(samples, st.data())
def test_semantic_entropy_invariant_to_relabelling(seqs, data):
    ids = data.draw(st.lists(st.integers(0, 3), min_size=len(seqs), max_size=len(seqs)))
    perm = data.draw(st.permutations(range(4)))
    relabelled = [perm[i] + 10 for i in ids]
    for fn in (M.semantic_entropy, M.ln_semantic_entropy, M.max_cluster_probability):
        assert fn(seqs, relabelled) == pytest.approx(fn(seqs, ids), abs=1e-9)  # same path: float64, the same values relabelled
    assert M.discrete_semantic_entropy(relabelled) == pytest.approx(
        M.discrete_semantic_entropy(ids)
    )


@given(st.lists(logprob, min_size=1, max_size=8))
def test_length_normalised_equal_plain_for_length_one(values):
    seqs = [[v] for v in values]
    assert M.ln_g_nll(seqs[0]) == pytest.approx(M.g_nll(seqs[0]))
    assert M.ln_predictive_entropy(seqs) == pytest.approx(M.predictive_entropy(seqs))
    ids = list(range(len(seqs)))
    assert M.ln_semantic_entropy(seqs, ids) == pytest.approx(M.semantic_entropy(seqs, ids))


@given(samples)
def test_mcp_is_lower_bound_of_se(seqs):
    ids = [i % 3 for i in range(len(seqs))]
    # min-entropy <= Shannon entropy, the semantic analogue of Eq. 8.
    assert M.max_cluster_probability(seqs, ids) <= M.semantic_entropy(seqs, ids) + 1e-9


def test_registry_order_covers_every_measure_once():
    assert sorted(M.ORDER) == sorted(M.MEASURES)
    assert len(set(M.ORDER)) == len(M.ORDER)
    assert set(M.PAPER_BASELINES) <= set(M.ORDER)
    assert all(M.get(b).uses_samples for b in M.PAPER_BASELINES)
    assert len({M.get(m).label for m in M.ORDER}) == len(M.ORDER)


GREEDY = [-0.5, -0.25]
BEAMS = [[-0.5, -0.25], [-0.1], [-3.0]]
SAMPLES = [[-1.0], [-2.0], [-1.0]]
IDS = [0, 0, 1]


def test_compute_calls_each_measure_with_what_it_needs():
    values = M.compute(M.ORDER, greedy=GREEDY, beams=BEAMS, samples=SAMPLES, cluster_ids=IDS)
    assert list(values) == list(M.ORDER)
    assert values == {
        "pe": M.predictive_entropy(SAMPLES),
        "ln-pe": M.ln_predictive_entropy(SAMPLES),
        "se": M.semantic_entropy(SAMPLES, IDS),
        "ln-se": M.ln_semantic_entropy(SAMPLES, IDS),
        "d-se": M.discrete_semantic_entropy(IDS),
        "se-rb": M.semantic_entropy_plugin(SAMPLES, IDS),
        "ln-se-rb": M.ln_semantic_entropy_plugin(SAMPLES, IDS),
        "mcp": M.max_cluster_probability(SAMPLES, IDS),
        "g-nll": M.g_nll(GREEDY),
        "ln-g-nll": M.ln_g_nll(GREEDY),
        "bs-msp": M.msp_estimate(BEAMS),
    }


def test_compute_accepts_generation_objects():
    from gnll.backends.base import Generation

    def gen(lps):
        return Generation(
            text="x",
            token_ids=[1] * len(lps),
            tokens=["x"] * len(lps),
            token_logprobs=lps,
            finish_reason="stop",
        )

    values = M.compute(["g-nll", "pe"], greedy=gen(GREEDY), samples=[gen(s) for s in SAMPLES])
    assert values == {"g-nll": M.g_nll(GREEDY), "pe": M.predictive_entropy(SAMPLES)}


def test_compute_names_missing_evidence():
    with pytest.raises(ValueError, match="'se' needs samples and clusters"):
        M.compute(["g-nll", "se"], greedy=GREEDY)
    with pytest.raises(ValueError, match="'d-se' needs clusters"):
        M.compute(["d-se"], samples=SAMPLES)


def test_requirements_and_computable():
    assert M.requirements(["g-nll"]) == M.Needs.GREEDY
    # Cluster ids are ids of samples: asking for D-SE means generating samples.
    assert M.requirements(["d-se"]) == M.Needs.SAMPLES | M.Needs.CLUSTERS
    assert M.requirements(["bs-msp", "pe"]) == M.Needs.BEAMS | M.Needs.SAMPLES
    have = M.Needs.GREEDY | M.Needs.SAMPLES
    assert M.computable(M.ORDER, have) == ["pe", "ln-pe", "g-nll", "ln-g-nll"]
    assert {M.get(m).source for m in M.ORDER} == {"greedy", "beams", "samples"}
    assert M.get("d-se").source == "samples"  # its token cost is the samples'


def test_validate():
    assert M.validate("all") == list(M.ORDER)
    assert M.validate(" g-nll,pe,,g-nll ") == ["g-nll", "pe"]
    assert M.validate(["g-nll", "pe"], paper_order=True) == ["pe", "g-nll"]
    with pytest.raises(ValueError, match=r"unknown measure\(s\) \['bogus'\]"):
        M.validate("g-nll,bogus")
    with pytest.raises(ValueError, match="no measures selected"):
        M.validate(" , ")


def test_capability_check_names_what_is_missing():
    from gnll.backends.base import Capabilities

    assert M.required_capabilities(M.ORDER) == ["beams"]
    assert M.unsupported(M.ORDER, Capabilities(beams=False)) == {"bs-msp": ["beams"]}
    assert M.unsupported(M.ORDER, Capabilities()) == {}
