"""How well an uncertainty score separates correct from incorrect answers.

Conventions: ``correct`` is a 0/1 (or bool) array, ``scores`` are uncertainties (higher = more
uncertain).
AUROC treats *incorrect* answers as positives. Answers are "rejected" most-uncertain first; ties
among
uncertainties are resolved by their expected value under random tie-breaking, so results never
depend on
the order of records.

Examples
--------
>>> auroc([1, 1, 0, 0], [0.1, 0.2, 0.3, 0.4])  # wrong answers all more uncertain
1.0
>>> rejection_accuracy([1, 1, 0, 0, 1], [0.1, 0.2, 0.3, 0.9, 0.4], fraction=0.8)
0.75
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import rankdata

from gnll._util.seeds import seed_from
from gnll._util.validation import check_scores_labels
from gnll.measures import PAPER_BASELINES

__all__ = [
    "accuracy_curve",
    "aurac",
    "auroc",
    "averaged_paired_test",
    "bootstrap_auroc",
    "evaluate_measures",
    "paired_bootstrap_test",
    "prediction_rejection_area",
    "prr_metrics",
    "prr_order_dependent",
    "rejection_accuracy",
    "tie_averaged_prr",
]


def _arrays(correct: Sequence, scores: Sequence) -> tuple[np.ndarray, np.ndarray]:
    s, c = check_scores_labels(scores, correct, names=("scores", "correct"), binary=False)
    return c, s


def auroc(correct: Sequence, scores: Sequence) -> float:
    """AUROC of ``scores`` for detecting incorrect answers (scikit-learn); NaN for one class."""
    from sklearn.metrics import roc_auc_score

    c, s = _arrays(correct, scores)
    y = (c < 0.5).astype(int)
    if (
        len(y) == 0 or y.min() == y.max()
    ):  # no decided question (e.g. every judge reply unparseable)
        return float("nan")
    return float(roc_auc_score(y, s))


def _auroc_batch(y: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Row-wise AUROC by the Mann-Whitney U statistic (midranks for ties); ``y``, ``s``: (B, n)."""
    ranks = rankdata(s, axis=1)
    n_pos = y.sum(axis=1)
    n_neg = y.shape[1] - n_pos
    u = (ranks * y).sum(axis=1) - n_pos * (n_pos + 1) / 2
    with np.errstate(invalid="ignore", divide="ignore"):
        out = u / (n_pos * n_neg)
    out[(n_pos == 0) | (n_neg == 0)] = np.nan
    return out


def _bootstrap_indices(n: int, n_boot: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def bootstrap_auroc(
    correct: Sequence, scores: Sequence, *, n_boot: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """AUROC and its bootstrap standard error (std of AUROC over ``n_boot`` resamples of questions).

    Resamples in which only one class occurs are skipped. Deterministic for a given ``seed``.
    """
    c, s = _arrays(correct, scores)
    point = auroc(c, s)
    if math.isnan(point) or n_boot < 2:
        return point, float("nan")
    idx = _bootstrap_indices(len(c), n_boot, seed)
    vals = _auroc_batch((c[idx] < 0.5).astype(np.float64), s[idx])
    vals = vals[np.isfinite(vals)]
    return point, float(np.std(vals, ddof=1)) if len(vals) > 1 else float("nan")


def paired_bootstrap_test(
    correct: Sequence, scores_a: Sequence, scores_b: Sequence, *, n_boot: int = 1000, seed: int = 0
) -> dict[str, float]:
    """One-sided paired bootstrap test of ``H0: AUROC(a) <= AUROC(b)``.

    Both measures are evaluated on the same resampled questions; the p-value is
    ``(1 + #{resamples with AUROC(a) - AUROC(b) <= 0}) / (1 + #resamples)``.
    """
    c, a = _arrays(correct, scores_a)
    _, b = _arrays(correct, scores_b)
    diff = auroc(c, a) - auroc(c, b)
    if math.isnan(diff):
        return {"diff": float("nan"), "p_value": float("nan"), "n_boot": 0}
    idx = _bootstrap_indices(len(c), n_boot, seed)
    y = (c[idx] < 0.5).astype(np.float64)
    d = _auroc_batch(y, a[idx]) - _auroc_batch(y, b[idx])
    d = d[np.isfinite(d)]
    p = (1 + int(np.sum(d <= 0))) / (1 + len(d))
    return {"diff": float(diff), "p_value": float(p), "n_boot": int(len(d))}


def averaged_paired_test(
    strata: Sequence[tuple[str, Sequence, dict[str, Sequence[float]]]],
    *,
    reference: str = "g-nll",
    baselines: Sequence[str] = ("pe", "ln-pe", "se", "ln-se", "d-se"),
    n_boot: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
    weights: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Paired bootstrap test of G-NLL against the best baseline on an AUROC *averaged over tasks*.

    ``strata`` holds one ``(key, correct, {measure: scores})`` per task (the rows of the paper's
    dataset-averaged lines). Questions are resampled within each task (stratified bootstrap; the
    resample indices of a task are seeded by ``seed`` and its ``key``, so two correctness metrics of
    one task resample the same questions); each resample's statistic is the mean over tasks of
    AUROC(reference) - AUROC(best baseline). The best baseline is the one with the highest mean
    AUROC on the full data. Resamples in which some task has a single class are skipped. The
    one-sided p-value is ``(1 + #{diff <= 0}) / (1 + #resamples)``, as in
    :func:`paired_bootstrap_test`. ``weights`` (one per task; default equal) makes every mean a
    weighted one: an overall Average that weighs each table row once gives each task 1 / (its
    row's number of tasks).

    >>> c = [1, 1, 1, 0, 0, 0] * 5
    >>> good, bad = [0, 1, 2, 7, 8, 9] * 5, [5, 0, 9, 1, 8, 2] * 5
    >>> res = averaged_paired_test([("a", c, {"g-nll": good, "pe": bad}),
    ...                             ("b", c, {"g-nll": good, "pe": bad})], n_boot=200)
    >>> res["best_baseline"], res["significant"]
    ('pe', True)
    """
    names = None
    for _key, _c, ms in strata:
        names = set(ms) if names is None else names & set(ms)
    names = names or set()
    out: dict[str, Any] = {
        "reference": reference,
        "alpha": alpha,
        "n_boot": n_boot,
        "seed": seed,
        "n_tasks": len(strata),
        "stratified": True,
    }
    present = [b for b in baselines if b in names]
    if reference not in names or not present or not strata:
        return out
    used = [reference, *present]
    points = {m: [auroc(c, ms[m]) for _k, c, ms in strata] for m in used}
    if any(math.isnan(v) for vals in points.values() for v in vals):
        out["note"] = "a task has a single correctness class: its AUROC is undefined"
        return out
    if weights is None:  # equal weights, summed then divided (the numbers of earlier runs)
        w, scale = np.ones(len(strata)), float(len(strata))
    else:
        w = np.asarray(weights, dtype=np.float64)
        if w.shape != (len(strata),) or not np.all(w > 0):
            raise ValueError(f"weights: one positive weight per task ({len(strata)}): {weights!r}")
        w, scale = w / w.sum(), 1.0
    mean = {
        m: float(np.mean(v)) if weights is None else float(np.dot(w, v)) for m, v in points.items()
    }
    best = max(present, key=lambda m: mean[m])
    total = np.zeros(n_boot)
    for wi, (key, c, ms) in zip(w, strata, strict=True):
        cc = np.asarray(c, dtype=np.float64)
        idx = _bootstrap_indices(len(cc), n_boot, seed_from(seed, key))
        y = (cc[idx] < 0.5).astype(np.float64)
        a = np.asarray(ms[reference], dtype=np.float64)[idx]
        b = np.asarray(ms[best], dtype=np.float64)[idx]
        total += wi * (_auroc_batch(y, a) - _auroc_batch(y, b))  # NaN: a resample of one class
    d = total[np.isfinite(total)] / scale
    p = (1 + int(np.sum(d <= 0))) / (1 + len(d))
    out.update(
        {
            "best_baseline": best,
            "diff": mean[reference] - mean[best],
            "p_value": float(p),
            "n_valid": int(len(d)),
            "significant": bool(p < alpha),
        }
    )
    return out


def accuracy_curve(correct: Sequence, scores: Sequence) -> np.ndarray:
    """Accuracy of the ``k`` least uncertain answers for ``k = 1..n`` (ties at expected value).

    >>> accuracy_curve([1, 0], [0.5, 0.5]).tolist()
    [0.5, 0.5]
    """
    c, s = _arrays(correct, scores)
    if len(c) == 0:
        return np.array([])
    order = np.argsort(s, kind="stable")
    s_sorted, c_sorted = s[order], c[order]
    # Replace correctness within each group of tied scores by the group mean.
    _, start, counts = np.unique(s_sorted, return_index=True, return_counts=True)
    group_mean = np.add.reduceat(c_sorted, start) / counts
    c_avg = np.repeat(group_mean, counts)
    return np.cumsum(c_avg) / np.arange(1, len(c) + 1)


def rejection_accuracy(correct: Sequence, scores: Sequence, fraction: float = 0.8) -> float:
    """Accuracy on the ``fraction`` of answers with the lowest uncertainty (ARA@80 for 0.8).

    Keeps ``ceil(fraction * n)`` answers.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    curve = accuracy_curve(correct, scores)
    if len(curve) == 0:
        return float("nan")
    k = max(1, math.ceil(fraction * len(curve) - 1e-9))
    return float(curve[k - 1])


def aurac(correct: Sequence, scores: Sequence) -> float:
    """Area under the accuracy-vs-retained-fraction curve: mean of :func:`accuracy_curve`."""
    curve = accuracy_curve(correct, scores)
    return float(curve.mean()) if len(curve) else float("nan")


def evaluate_measures(
    correct: Sequence,
    measures: dict[str, Sequence[float]],
    *,
    n_boot: int = 1000,
    seed: int = 0,
    reference: str = "g-nll",
    baselines: Sequence[str] = PAPER_BASELINES,
    alpha: float = 0.05,
) -> dict[str, Any]:
    """All metrics for one task x correctness metric.

    Returns ``{"n", "accuracy", "measures": {name: {auroc, auroc_se, ara80, aurac}},
    "significance"}``,
    where ``significance`` compares ``reference`` (G-NLL) with the best of ``baselines`` present
    (the
    paper's sampling-based measures) by a paired bootstrap, and lists its p-value against every
    measure.
    """
    c = np.asarray(correct, dtype=np.float64)
    out: dict[str, Any] = {
        "n": int(len(c)),
        "accuracy": float(c.mean()) if len(c) else float("nan"),
        "n_correct": int(c.sum()),
        "n_incorrect": int(len(c) - c.sum()),
    }
    per: dict[str, dict[str, float]] = {}
    for name, sc in measures.items():
        a, se = bootstrap_auroc(c, sc, n_boot=n_boot, seed=seed)
        per[name] = {
            "auroc": a,
            "auroc_se": se,
            "ara80": rejection_accuracy(c, sc, 0.8),
            "aurac": aurac(c, sc),
        }
    out["measures"] = per
    sig: dict[str, Any] = {"reference": reference, "alpha": alpha, "n_boot": n_boot, "seed": seed}
    present = [b for b in baselines if b in per and not math.isnan(per[b]["auroc"])]
    if reference in per and not math.isnan(per[reference]["auroc"]):
        sig["p_values"] = {
            m: paired_bootstrap_test(c, measures[reference], measures[m], n_boot=n_boot, seed=seed)[
                "p_value"
            ]
            for m in per
            if m != reference
        }
        if present:
            best = max(present, key=lambda m: per[m]["auroc"])
            sig["best_baseline"] = best
            sig["p_value"] = sig["p_values"][best]
            sig["significant"] = bool(sig["p_value"] < alpha)
    out["significance"] = sig
    return out


def _minmax(quality: np.ndarray) -> np.ndarray:
    lo, hi = float(np.min(quality)), float(np.max(quality))
    if np.isclose(lo, hi):  # a constant quality: LM-Polygraph widens the range by 1 each way
        lo, hi = lo - 1, hi + 1
    return (quality - lo) / (hi - lo)


def prediction_rejection_area(
    uncertainty: Sequence[float], quality: Sequence[float], max_rejection: float = 1.0
) -> float:
    """LM-Polygraph's PRR: the mean quality of the kept answers over the rejection levels.

    Quality is min-max normalised; the answers are sorted by uncertainty (ascending, numpy's default
    sort, as LM-Polygraph's ``PredictionRejectionArea``), and for each of the
    ``R = int(max_rejection * n)`` levels that keep the ``k = n - R + 1 ... n`` least uncertain, the
    mean normalised quality of those ``k`` is averaged. Higher is better.

    >>> prediction_rejection_area([0.1, 0.9, 0.5], [1, 0, 1])
    0.8888888888888888
    """
    q = _minmax(np.asarray(quality, dtype=float))
    ue = np.asarray(uncertainty, dtype=float)
    n = len(ue)
    r = int(max_rejection * n)
    if n == 0 or r == 0:
        raise ValueError(f"PRR needs answers to reject (n={n}, max_rejection={max_rejection})")
    kept = np.cumsum(q[np.argsort(ue)])[-r:]
    return float(np.sum((kept / np.arange(n - r + 1, n + 1))[::-1]) / r)


def _random_prr(q: np.ndarray, max_rejection: float, n_random: int, seed: int) -> float:
    """Mean PRR of ``n_random`` random rankings: :func:`prediction_rejection_area` of each
    shuffled ``arange(n)`` (one ``RandomState(seed)`` stream shuffling in place, as LM-Polygraph),
    computed for all rankings at once and once per quality vector (``results.json`` records it
    for every measure of a task)."""
    return _random_prr_of(q.tobytes(), max_rejection, n_random, seed)


@functools.lru_cache(maxsize=64)
def _random_prr_of(q_bytes: bytes, max_rejection: float, n_random: int, seed: int) -> float:
    q = np.frombuffer(q_bytes, dtype=np.float64)
    n = len(q)
    r = int(max_rejection * n)
    if n == 0 or r == 0:
        raise ValueError(f"PRR needs answers to reject (n={n}, max_rejection={max_rejection})")
    rng = np.random.RandomState(seed)
    order = np.arange(n)
    perms = np.empty((n_random, n), dtype=order.dtype)
    for i in range(n_random):
        rng.shuffle(order)
        perms[i] = order
    qn = _minmax(q)
    kept = np.cumsum(qn[np.argsort(perms, axis=1)], axis=1)[:, -r:]
    areas = np.sum((kept / np.arange(n - r + 1, n + 1))[:, ::-1], axis=1) / r
    return float(np.mean(areas))


def prr_metrics(
    uncertainty: Sequence[float],
    quality: Sequence[float],
    *,
    n_random: int = 1000,
    seed: int = 42,
) -> dict[str, float]:
    """The PRR numbers of LM-Polygraph's benchmark for one measure, under its names.

    ``prr`` and ``prr_0.5`` (rejecting at most half), each also ``_normalized``:
    ``(prr - random) / (oracle - random)``, where *oracle* ranks by the quality itself and *random*
    is the mean over ``n_random`` random rankings (LM-Polygraph's ``get_random_scores``: a
    ``np.random.seed(42)`` stream shuffling ``arange(n)``, reproduced here without touching numpy's
    global state). Non-finite values are treated as LM-Polygraph's ``UEManager`` treats them: an
    answer whose quality is NaN is left out (and the oracle and random rankings are those of the
    answers kept), while a non-finite *uncertainty* is kept and clipped, NaN and -inf to -1e7 (the
    most certain), +inf to +1e7. So uncertainties (0.1, NaN, 0.5, 0.3, 0.7, 0.2) with qualities
    (1, 0, 1, 0, 0, 1) give ``prr`` 0.4611 and ``prr_normalized`` -0.1054, as LM-Polygraph 0.7.0
    does (leaving the NaN answer out would give 0.8033 and 0.7574). An infinite quality is refused.
    ``quality`` is higher-is-better (e.g. correctness 0/1).

    With tied uncertainties the PRR depends on the order of the records: the answers are sorted
    by uncertainty with numpy's default (unstable) sort, as LM-Polygraph's, so a tie between a
    right and a wrong answer is broken by position. :func:`tie_averaged_prr` is the same area with
    every tie at its expected value, which no reordering changes.

    >>> m = prr_metrics([0.1, 0.9, 0.5, 0.3], [1, 0, 1, 0])
    >>> sorted(m)
    ['prr', 'prr_0.5', 'prr_0.5_normalized', 'prr_normalized']
    """
    ue = np.asarray(uncertainty, dtype=float)
    q = np.asarray(quality, dtype=float)
    if ue.shape != q.shape:
        raise ValueError(f"{len(ue)} uncertainties but {len(q)} qualities")
    if np.isinf(q).any():
        raise ValueError("prr_metrics: a quality is infinite")
    keep = ~np.isnan(q)  # UEManager's _delete_nans: NaN qualities out, uncertainties clipped
    ue, q = np.nan_to_num(ue[keep], nan=-1e7, neginf=-1e7, posinf=1e7), q[keep]
    out: dict[str, float] = {}
    for name, max_rejection in (("prr", 1.0), ("prr_0.5", 0.5)):
        value = prediction_rejection_area(ue, q, max_rejection)
        oracle = prediction_rejection_area(-q, q, max_rejection)
        random = _random_prr(q, max_rejection, n_random, seed)
        out[name] = value
        out[f"{name}_normalized"] = (
            (value - random) / (oracle - random) if oracle != random else value
        )
    return out


def tie_averaged_prr(
    uncertainty: Sequence[float], quality: Sequence[float], max_rejection: float = 1.0
) -> dict[str, float]:
    """The PRR of :func:`prediction_rejection_area` with tied uncertainties at their expected
    value, and its normalised form: the same numbers whatever the order of the records.

    Within a group of tied uncertainties the kept answers' quality is the group's mean (as ARA@80
    and AURAC treat ties, :func:`accuracy_curve`), which is the mean of LM-Polygraph's PRR over
    every order of the tied answers. Normalised with the oracle ranking and the *exact* mean of a
    random ranking (the mean quality at every level), not 1,000 seeded shuffles, whose estimate
    also moves with the record order. Not an LM-Polygraph number: gnll's order-invariant
    companion for measures with ties (D-SE). Non-finite values as :func:`prr_metrics`.

    >>> round(tie_averaged_prr([0.0, 0.0, 1.0], [1, 0, 0])["prr"], 4)  # (1/2 + 1/2 + 1/3) / 3
    0.4444
    """
    ue = np.asarray(uncertainty, dtype=float)
    q = np.asarray(quality, dtype=float)
    if ue.shape != q.shape:
        raise ValueError(f"{len(ue)} uncertainties but {len(q)} qualities")
    if np.isinf(q).any():
        raise ValueError("tie_averaged_prr: a quality is infinite")
    keep = ~np.isnan(q)
    ue, q = np.nan_to_num(ue[keep], nan=-1e7, neginf=-1e7, posinf=1e7), q[keep]
    n = len(ue)
    r = int(max_rejection * n)
    if n == 0 or r == 0:
        raise ValueError(f"PRR needs answers to reject (n={n}, max_rejection={max_rejection})")
    qn = _minmax(q)
    curve = accuracy_curve(qn, ue)  # mean quality of the k least uncertain, ties averaged
    value = float(np.mean(curve[n - r :]))
    oracle = prediction_rejection_area(-q, q, max_rejection)
    random = float(np.mean(qn))  # a random ranking keeps the mean quality at every level
    normalized = (value - random) / (oracle - random) if oracle != random else value
    return {"prr": value, "prr_normalized": normalized}


def prr_order_dependent(uncertainty: Sequence[float], quality: Sequence[float]) -> bool:
    """Whether LM-Polygraph's PRR of these answers can change with their order: some tie in
    uncertainty joins answers of different quality (after :func:`prr_metrics`' clipping).

    >>> prr_order_dependent([0.1, 0.1, 0.5], [1, 0, 1]), prr_order_dependent([0.1, 0.1], [1, 1])
    (True, False)
    """
    ue = np.asarray(uncertainty, dtype=float)
    q = np.asarray(quality, dtype=float)
    keep = ~np.isnan(q)
    ue, q = np.nan_to_num(ue[keep], nan=-1e7, neginf=-1e7, posinf=1e7), q[keep]
    order = np.lexsort((q, ue))
    u, qq = ue[order], q[order]
    same = u[1:] == u[:-1]
    return bool(np.any(same & (qq[1:] != qq[:-1])))
