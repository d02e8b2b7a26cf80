"""Evaluation metrics against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from gnll.evaluation.results.metrics import (
    _auroc_batch,
    accuracy_curve,
    aurac,
    auroc,
    bootstrap_auroc,
    evaluate_measures,
    paired_bootstrap_test,
    rejection_accuracy,
)


def test_auroc_tiny_hand_computed():
    # incorrect answers (positives): scores 0.8, 0.4 ; correct (negatives): 0.1, 0.5, 0.3
    correct = [0, 1, 1, 0, 1]
    scores = [0.8, 0.1, 0.5, 0.4, 0.3]
    # pairs (pos, neg) with pos > neg: 0.8 beats all 3; 0.4 beats 0.1 and 0.3 -> 5 of 6
    assert auroc(correct, scores) == pytest.approx(5 / 6)


def test_auroc_ties_count_half_and_direction():
    assert auroc([0, 1], [0.5, 0.5]) == pytest.approx(0.5)
    assert auroc([1, 1, 0, 0], [0.1, 0.2, 0.3, 0.4]) == 1.0
    assert auroc([1, 1, 0, 0], [0.4, 0.3, 0.2, 0.1]) == 0.0  # uncertainty pointing the wrong way


def test_auroc_single_class_is_nan():
    assert math.isnan(auroc([1, 1, 1], [0.1, 0.2, 0.3]))


def test_auroc_batch_matches_sklearn():
    rng = np.random.default_rng(3)
    y = (rng.random((20, 50)) < 0.4).astype(float)
    s = np.round(rng.random((20, 50)), 1)  # many ties
    got = _auroc_batch(y, s)
    want = [roc_auc_score(y[i], s[i]) for i in range(20)]
    np.testing.assert_allclose(got, want)


def test_rejection_accuracy_hand_computed():
    correct = [1, 1, 0, 0, 1]
    scores = [0.1, 0.2, 0.3, 0.9, 0.4]
    # keep ceil(0.8*5)=4 least uncertain: 0.1(1) 0.2(1) 0.3(0) 0.4(1) -> 3/4
    assert rejection_accuracy(correct, scores, 0.8) == pytest.approx(0.75)
    assert rejection_accuracy(correct, scores, 1.0) == pytest.approx(0.6)


def test_rejection_accuracy_ties_at_expected_value():
    # 5 answers, keep 4; the tied group {0.5, 0.5, 0.5} holds one right and two wrong answers,
    # two of which are kept: expected (2 + 2/3) / 4.
    correct = [1, 1, 1, 0, 0]
    scores = [0.1, 0.2, 0.5, 0.5, 0.5]
    assert rejection_accuracy(correct, scores, 0.8) == pytest.approx((2 + 2 / 3) / 4)
    # and the result does not depend on record order
    perm = [3, 0, 4, 2, 1]
    shuffled = rejection_accuracy(np.array(correct)[perm], np.array(scores)[perm], 0.8)
    assert shuffled == pytest.approx((2 + 2 / 3) / 4)


def test_aurac_is_mean_of_accuracy_curve():
    correct = [1, 0, 1, 1]
    scores = [0.1, 0.2, 0.3, 0.4]
    curve = accuracy_curve(correct, scores)
    np.testing.assert_allclose(curve, [1, 1 / 2, 2 / 3, 3 / 4])
    assert aurac(correct, scores) == pytest.approx((1 + 0.5 + 2 / 3 + 0.75) / 4)


def test_bootstrap_is_deterministic_for_a_seed():
    rng = np.random.default_rng(0)
    c = rng.random(200) < 0.5
    s = rng.random(200) + 0.3 * ~c
    a1 = bootstrap_auroc(c, s, n_boot=300, seed=7)
    a2 = bootstrap_auroc(c, s, n_boot=300, seed=7)
    a3 = bootstrap_auroc(c, s, n_boot=300, seed=8)
    assert a1 == a2
    assert a1[0] == a3[0] and a1[1] != a3[1]
    # SE of an AUROC from 200 points is a few hundredths
    assert 0.01 < a1[1] < 0.08


def test_paired_bootstrap_test():
    rng = np.random.default_rng(1)
    n = 300
    c = rng.random(n) < 0.5
    good = rng.normal(size=n) + 1.5 * ~c  # informative
    bad = rng.normal(size=n)  # noise
    res = paired_bootstrap_test(c, good, bad, n_boot=500, seed=0)
    assert res["diff"] > 0.2 and res["p_value"] < 0.01
    rev = paired_bootstrap_test(c, bad, good, n_boot=500, seed=0)
    assert rev["p_value"] > 0.95
    assert paired_bootstrap_test(c, good, bad, n_boot=500, seed=0) == res


def test_evaluate_measures_picks_best_baseline():
    rng = np.random.default_rng(2)
    n = 200
    c = (rng.random(n) < 0.5).astype(float)
    m = {
        "g-nll": rng.normal(size=n) + 2.0 * (1 - c),
        "pe": rng.normal(size=n) + 0.5 * (1 - c),
        "d-se": rng.normal(size=n) + 1.0 * (1 - c),
        "mcp": rng.normal(size=n) + 3.0 * (1 - c),  # not a paper baseline: never "best"
    }
    res = evaluate_measures(c, m, n_boot=200, seed=0)
    sig = res["significance"]
    assert sig["best_baseline"] == "d-se"
    assert sig["significant"] is True
    assert set(sig["p_values"]) == {"pe", "d-se", "mcp"}
    assert res["n"] == n and 0 <= res["accuracy"] <= 1
    assert set(res["measures"]["pe"]) == {"auroc", "auroc_se", "ara80", "aurac"}
