"""Abstention thresholds on an uncertainty score with finite-sample guarantees.

The rule is always: *answer when score <= threshold, abstain otherwise* (higher score = more
uncertain, as G-NLL).

**Target accuracy among answered questions** (:func:`accuracy_threshold`): the threshold is chosen by
*Learn then Test* (Angelopoulos, Bates, Candès, Jordan & Lei, 2021): candidate thresholds are the score
quantiles at coverage 1/grid, 2/grid, ..., 1; for each, the hypothesis "accuracy among answered <
target" is tested with an exact one-sided Clopper-Pearson (binomial) test at level ``delta``; the
tests run in that fixed order (strictest threshold first) and stop at the first one that cannot be
rejected, which controls the family-wise error at ``delta`` without a Bonferroni penalty. The
guarantee: with probability at least ``1 - delta`` over the labelled data, the accuracy among
answered questions on new questions from the same distribution is at least ``target``. If even the
strictest candidate fails, the rule abstains on everything (an empty answered set meets any target).

Why Clopper-Pearson: correctness is 0/1, so the count of correct answers among ``n`` answered is
exactly binomial; the Clopper-Pearson bound is valid at every ``n`` without asymptotics and much
tighter than Hoeffding's when accuracy is near 0 or 1. Why not conformal risk control: it bounds the
risk only in expectation over the calibration draw, while a threshold fixed once and used from then
on needs a bound that holds with high probability for *that* threshold.

The candidate grid is built from the scores (never the labels) of the same data; the simulation in
``tests/calibration/test_calibration.py`` checks that the violation rate stays below ``delta``.

**Target coverage** (:func:`coverage_threshold`): the threshold is the ``k``-th smallest score, with
``k`` the smallest rank such that ``P(Binomial(n, target) >= k) <= delta``. The coverage of the
``k``-th order statistic is ``Beta(k, n + 1 - k)`` distributed whatever the score distribution
(continuous scores), so with probability at least ``1 - delta`` the fraction of new questions
answered is at least ``target``.

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> s = rng.uniform(0, 1, 2000); y = rng.uniform(0, 1, 2000) < 1 - s  # P(correct | s) = 1 - s
>>> t = accuracy_threshold(s, y, target=0.8, delta=0.1)
>>> 0.2 < t.coverage < 0.4 and t.accuracy >= 0.8
True
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from scipy.stats import beta, binom

from gnll._util.validation import check_scores_labels

__all__ = ["Threshold", "accuracy_threshold", "clopper_pearson_lower", "coverage_threshold"]


@dataclass
class Threshold:
    """An abstention rule ``answer if score <= threshold`` and what it gives on the labelled data.

    Attributes
    ----------
    kind, target, delta:
        ``"accuracy"`` (accuracy among answered >= target) or ``"coverage"`` (fraction answered >=
        target), guaranteed with probability >= ``1 - delta``.
    threshold:
        ``-inf`` abstains on everything, ``inf`` answers everything.
    coverage, accuracy, n_answered:
        On the labelled data: fraction answered, accuracy among answered (NaN if none), count.
    accuracy_lower:
        One-sided ``1 - delta`` Clopper-Pearson lower bound of the accuracy among answered.
    method:
        How the threshold was chosen (stated in the calibration file).
    """

    kind: Literal["accuracy", "coverage"]
    target: float
    delta: float
    threshold: float
    coverage: float
    accuracy: float
    accuracy_lower: float
    n_answered: int
    method: str

    def answers(self, scores: np.ndarray) -> np.ndarray:
        """Boolean mask: which of ``scores`` the rule answers (the rest it abstains on)."""
        return np.asarray(scores, dtype=np.float64) <= self.threshold

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        # JSON has no infinities: the edge cases become null plus a flag that says which.
        d["abstains_on_all"] = self.threshold == -math.inf
        d["answers_all"] = self.threshold == math.inf
        for k in ("threshold", "accuracy", "accuracy_lower"):
            if not math.isfinite(d[k]):
                d[k] = None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Threshold:
        d = dict(d)
        abstain_all = d.pop("abstains_on_all", False)
        answer_all = d.pop("answers_all", False)
        if d["threshold"] is None:
            d["threshold"] = -math.inf if abstain_all else math.inf if answer_all else math.nan
        for k in ("accuracy", "accuracy_lower"):
            if d.get(k) is None:
                d[k] = math.nan
        return cls(**d)


def clopper_pearson_lower(k: int, n: int, delta: float) -> float:
    """One-sided ``1 - delta`` lower confidence bound on a binomial proportion (``k`` of ``n``)."""
    if n == 0:
        return math.nan
    if k == 0:
        return 0.0
    return float(beta.ppf(delta, k, n - k + 1))


def _validate(scores: Any, labels: Any, target: float, delta: float) -> tuple[np.ndarray, ...]:
    s, y = check_scores_labels(scores, labels, nonempty=True)
    if not (0 < target < 1):
        raise ValueError(f"target must be strictly between 0 and 1, got {target}")
    if not (0 < delta < 1):
        raise ValueError(f"delta must be strictly between 0 and 1, got {delta}")
    return s, y


def _summary(
    s: np.ndarray, y: np.ndarray, t: float, delta: float
) -> tuple[float, float, float, int]:
    m = s <= t
    n = int(m.sum())
    k = int(y[m].sum())
    acc = k / n if n else math.nan
    return n / len(s), acc, clopper_pearson_lower(k, n, delta), n


def accuracy_threshold(
    scores: Any, labels: Any, *, target: float = 0.8, delta: float = 0.1, grid: int = 20
) -> Threshold:
    """The loosest threshold whose accuracy among answered is >= ``target`` w.p. >= ``1 - delta``.

    Learn then Test with Clopper-Pearson p-values and fixed-sequence testing over ``grid`` coverage
    levels (see the module docstring for the guarantee and why this bound).
    """
    s, y = _validate(scores, labels, target, delta)
    order = np.sort(s)
    n = len(s)
    chosen = -math.inf
    for j in range(1, grid + 1):
        t = float(order[max(1, math.ceil(j * n / grid)) - 1])
        m = s <= t
        k, na = int(y[m].sum()), int(m.sum())
        # p-value of H0 "accuracy < target": P(Binomial(na, target) >= k).
        if binom.sf(k - 1, na, target) > delta:
            break
        chosen = t
    cov, acc, low, na = _summary(s, y, chosen, delta)
    return Threshold(
        "accuracy",
        target,
        delta,
        chosen,
        cov,
        acc,
        low,
        na,
        f"Learn then Test: one-sided Clopper-Pearson tests at level {delta} in fixed sequence over "
        f"{grid} coverage levels",
    )


def coverage_threshold(
    scores: Any, labels: Any, *, target: float = 0.8, delta: float = 0.1
) -> Threshold:
    """The smallest threshold whose coverage is >= ``target`` w.p. >= ``1 - delta`` (order statistic)."""
    s, y = _validate(scores, labels, target, delta)
    n = len(s)
    # Smallest k with P(Binomial(n, target) >= k) <= delta.
    k = int(binom.ppf(1 - delta, n, target)) + 1
    while k > 1 and binom.sf(k - 2, n, target) <= delta:
        k -= 1
    t = float(np.sort(s)[k - 1]) if k <= n else math.inf
    cov, acc, low, na = _summary(s, y, t, delta)
    return Threshold(
        "coverage",
        target,
        delta,
        t,
        cov,
        acc,
        low,
        na,
        f"order statistic k={k} of n={n}: P(Binomial(n, {target}) >= k) <= {delta}",
    )
