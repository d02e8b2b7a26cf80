"""Theorem 1 (App. B): sample-complexity bounds for estimating ``M(p)`` and ``H(p)``, and checks.

1. Max log-likelihood: ``|M - M_N| <= eps`` w.p. ``>= 1-delta`` if
   ``N >= (C_eps / P_eps) log(1/delta)`` with ``C_eps = P_eps / Q_eps`` (so the bound is
   ``log(1/delta) / Q_eps``), where ``P_eps``/``Q_eps`` are the masses of the eps-region
   ``{y : log p(y*) - log p(y) <= eps}`` under ``p`` and the proposal ``q``. The exact requirement
   is ``N >= log(delta) / log(1 - Q_eps)``; the bound relaxes it with ``log(1/(1-x)) >= x``.
2. Importance-weighted entropy: ``|H - H_N| <= eps`` w.p. ``>= 1-delta`` if
   ``N >= (b-a)**2 C**2 / (2 eps**2) log(2/delta)`` with ``a <= log p(y) <= b`` and ``p/q <= C``.

Example
-------
>>> round(max_likelihood_sample_bound(p_eps=0.5, q_eps=0.25, delta=0.1), 4)
9.2103
>>> round(entropy_sample_bound(a=-5.0, b=-1.0, c=2.0, eps=0.5, delta=0.05), 2)
472.18
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import numpy as np

from gnll.simulation.distributions import (
    PrefixTreeDistribution,
    enumerate_log_probs,
    path_extreme,
)
from gnll.simulation.estimators import (
    DEFAULT_WEIGHT_CLIP,
    importance_weights,
    sample_sequences,
    tempered_log_probs,
)

__all__ = [
    "check_tree",
    "entropy_bound_from_log_probs",
    "entropy_sample_bound",
    "epsilon_region_masses",
    "max_bound_from_log_probs",
    "max_likelihood_required_samples",
    "max_likelihood_sample_bound",
    "summarize_checks",
    "tree_epsilon_region",
    "tree_log_prob_range",
    "tree_max_log_weight",
]


def _check_eps_delta(eps: float, delta: float) -> None:
    if not (np.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be finite and > 0, got {eps!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def max_likelihood_sample_bound(p_eps: float, q_eps: float, delta: float) -> float:
    """Theorem 1.1: ``(C_eps / P_eps) log(1/delta)`` with ``C_eps = P_eps / Q_eps``.

    Parameters
    ----------
    p_eps, q_eps:
        Mass of the eps-region under ``p`` and under the proposal ``q`` (both in ``(0, 1]``).
    delta:
        Failure probability in ``(0, 1)``.

    Returns
    -------
    float
        The (real-valued) sufficient number of samples; round up to use it.

    Example
    -------
    >>> round(max_likelihood_sample_bound(1.0, 1.0, 0.5), 4)  # log 2
    0.6931
    """
    if not 0 < p_eps <= 1 + 1e-12 or not 0 < q_eps <= 1 + 1e-12:
        raise ValueError(f"p_eps and q_eps must be in (0, 1], got {p_eps!r}, {q_eps!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    c_eps = p_eps / q_eps
    return c_eps / p_eps * math.log(1.0 / delta)


def max_likelihood_required_samples(q_eps: float, delta: float) -> int:
    """Smallest ``N`` with ``(1 - Q_eps)**N <= delta`` (the exact requirement behind Theorem 1.1).

    Example
    -------
    >>> max_likelihood_required_samples(0.5, 0.1)  # 0.5**4 = 0.0625 <= 0.1 < 0.5**3
    4
    """
    if not 0 < q_eps <= 1 + 1e-12:
        raise ValueError(f"q_eps must be in (0, 1], got {q_eps!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if q_eps >= 1:
        return 1
    return max(1, math.ceil(math.log(delta) / math.log1p(-q_eps) - 1e-12))


def entropy_sample_bound(a: float, b: float, c: float, eps: float, delta: float) -> float:
    """Theorem 1.2: ``(b - a)**2 C**2 / (2 eps**2) log(2/delta)``.

    Parameters
    ----------
    a, b:
        ``a <= log p(y) <= b`` for all ``y`` (``a <= b``).
    c:
        ``C >= max_y p(y)/q(y)`` (``C > 0``).
    eps, delta:
        Accuracy (nats, > 0) and failure probability in ``(0, 1)``.

    Example
    -------
    >>> round(entropy_sample_bound(-3.0, -1.0, 1.0, 1.0, 0.1), 4)  # 4/2 * log 20
    5.9915
    """
    _check_eps_delta(eps, delta)
    if not (np.isfinite(a) and np.isfinite(b) and a <= b):
        raise ValueError(f"need finite a <= b, got a={a!r}, b={b!r}")
    if not (np.isfinite(c) and c > 0):
        raise ValueError(f"C must be finite and > 0, got {c!r}")
    return (b - a) ** 2 * c**2 / (2 * eps**2) * math.log(2.0 / delta)


def epsilon_region_masses(log_p: np.ndarray, log_q: np.ndarray, eps: float) -> tuple[float, float]:
    """``(P_eps, Q_eps)`` from explicit sequence log-probs under ``p`` and ``q`` (same order).

    Example
    -------
    >>> epsilon_region_masses(np.log([0.5, 0.4, 0.1]), np.log([0.2, 0.3, 0.5]), eps=0.3)
    (0.9, 0.5)
    """
    lp = np.asarray(log_p, dtype=np.float64)
    lq = np.asarray(log_q, dtype=np.float64)
    if lp.shape != lq.shape or lp.ndim != 1:
        raise ValueError("log_p and log_q must be 1-D arrays of equal length")
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
    region = lp >= lp.max() - eps
    return float(np.exp(lp[region]).sum()), float(np.exp(lq[region]).sum())


def max_bound_from_log_probs(
    log_p: np.ndarray, log_q: np.ndarray, eps: float, delta: float
) -> float:
    """Theorem 1.1 bound for explicit distributions ``p`` and ``q`` over the same sequences.

    Example
    -------
    >>> round(max_bound_from_log_probs(np.log([0.5, 0.5]), np.log([0.5, 0.5]), 0.1, 0.1), 4)
    2.3026
    """
    _check_eps_delta(eps, delta)
    p_eps, q_eps = epsilon_region_masses(log_p, log_q, eps)
    return max_likelihood_sample_bound(p_eps, q_eps, delta)


def entropy_bound_from_log_probs(
    log_p: np.ndarray, log_q: np.ndarray, eps: float, delta: float
) -> float:
    """Theorem 1.2 bound for explicit ``p``, ``q``: ``a, b`` = min/max ``log p``, ``C = max p/q``.

    Example
    -------
    >>> lp = np.log([0.5, 0.25, 0.25])
    >>> round(entropy_bound_from_log_probs(lp, lp, 0.5, 0.1), 4)  # (log 2)**2 / 0.5 * log 20
    2.8786
    """
    lp = np.asarray(log_p, dtype=np.float64)
    lq = np.asarray(log_q, dtype=np.float64)
    if lp.shape != lq.shape or lp.ndim != 1:
        raise ValueError("log_p and log_q must be 1-D arrays of equal length")
    support = np.isfinite(lp)
    c = float(np.exp(np.max(lp[support] - lq[support])))
    return entropy_sample_bound(float(lp[support].min()), float(lp.max()), c, eps, delta)


def tree_epsilon_region(
    tree: PrefixTreeDistribution,
    max_log_prob: float,
    eps: float,
    temperature: float,
    *,
    max_region: int = 10**7,
) -> tuple[float, float, int]:
    """``(P_eps, Q_eps, |Y_eps|)`` on a tree by pruned enumeration.

    Log-probabilities only decrease along a path, so a prefix whose ``log p`` is already below
    ``max_log_prob - eps`` cannot lead into the region: the search only ever holds region prefixes.

    Example
    -------
    >>> from gnll.simulation.distributions import PrefixTreeDistribution
    >>> tree = PrefixTreeDistribution.from_probabilities([[[0.6, 0.4]], [[0.5, 0.5], [0.9, 0.1]]])
    >>> p, q, n = tree_epsilon_region(tree, np.log(0.36), eps=0.2, temperature=1.0)
    >>> round(p, 2), n
    (0.96, 3)
    """
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
    floor = max_log_prob - eps - 1e-12
    v = tree.vocab_size
    node = np.zeros(1, dtype=np.int64)
    lp = np.zeros(1)
    lq = np.zeros(1)
    for t in range(tree.length):
        rows = tree.next_token_log_probs(t, node)
        cp = lp[:, None] + rows
        cq = lq[:, None] + tempered_log_probs(rows, temperature)
        keep = np.nonzero(cp >= floor)
        if keep[0].size > max_region:
            raise ValueError(f"eps-region exceeds {max_region} prefixes; use a smaller eps")
        node = node[keep[0]] * v + keep[1]
        lp, lq = cp[keep], cq[keep]
    return float(np.exp(lp).sum()), float(np.exp(lq).sum()), int(lp.size)


def tree_log_prob_range(tree: PrefixTreeDistribution) -> tuple[float, float]:
    """``(a, b) = (min_y log p(y), max_y log p(y))`` by dynamic programming over the tree."""
    return path_extreme(tree, mode="min"), path_extreme(tree, mode="max")


def tree_max_log_weight(tree: PrefixTreeDistribution, temperature: float) -> float:
    """``log C = max_y [log p(y) - log q_tau(y)]`` (unclipped) by dynamic programming.

    ``log p - log q`` is a sum of per-step terms, so its maximum decomposes like ``max log p``.
    """
    if temperature == 1.0:
        return 0.0

    def edge(rows: np.ndarray) -> np.ndarray:
        d = rows - tempered_log_probs(rows, temperature)
        return np.where(np.isfinite(rows), d, -np.inf)

    return path_extreme(tree, edge, mode="max", key=f"logw_tau{temperature!r}")


def check_tree(
    tree: PrefixTreeDistribution,
    rng: np.random.Generator,
    *,
    max_log_prob: float,
    entropy: float,
    ms_temperatures: tuple[float, ...] = (1.0, 0.5, 0.1),
    pe_temperatures: tuple[float, ...] = (1.0, 0.5),
    eps: float = 0.1,
    delta: float = 0.1,
    repeats: int = 100,
    sample_budget: int = 50_000,
    enumeration_limit: int = 10**6,
    clip: float = DEFAULT_WEIGHT_CLIP,
) -> dict[str, Any]:
    """Theorem 1 on one tree: bounds, exact requirements and an empirical failure rate.

    For each MS temperature: ``P_eps``, ``Q_eps``, the bound ``N_b = ceil(log(1/delta)/Q_eps)``,
    the exact ``N_req``, the analytic failure probability ``(1-Q_eps)**N_b`` and, if
    ``repeats * N_b`` fits in ``sample_budget`` (repeats are reduced, down to 20, otherwise), the
    observed fraction of ``repeats`` independent sets of ``N_b`` samples whose best sequence is
    *not* within ``eps`` of ``M``.

    For each PE temperature: Hoeffding's ``N_H`` (Theorem 1.2 with exact ``a, b, C``) and, when
    the tree has at most ``enumeration_limit`` sequences, the CLT sample size
    ``N_clt = (z sigma / eps)**2`` from the exact variance of one (clipped) importance-weighted
    term, i.e. what is actually needed.

    Returns
    -------
    dict
        ``{"max": {tau: {...}}, "entropy": {tau: {...}}, "a": a, "b": b}`` (JSON-friendly).
    """
    _check_eps_delta(eps, delta)
    a, b = tree_log_prob_range(tree)
    out: dict[str, Any] = {"a": a, "b": b, "max": {}, "entropy": {}}
    for tau in ms_temperatures:
        p_eps, q_eps, size = tree_epsilon_region(tree, max_log_prob, eps, tau)
        rec: dict[str, Any] = {"p_eps": p_eps, "q_eps": q_eps, "region_size": size}
        if q_eps <= 0:
            rec.update(n_bound=None, n_required=None, analytic_failure=1.0, empirical_failure=None)
            out["max"][str(tau)] = rec
            continue
        n_bound = math.ceil(max_likelihood_sample_bound(p_eps, min(q_eps, 1.0), delta) - 1e-12)
        n_bound = max(n_bound, 1)
        rec["n_bound"] = n_bound
        rec["n_required"] = max_likelihood_required_samples(min(q_eps, 1.0), delta)
        rec["analytic_failure"] = float(np.exp(n_bound * np.log1p(-min(q_eps, 1.0 - 1e-16))))
        reps = min(int(repeats), sample_budget // n_bound)
        if reps >= 20:
            s = sample_sequences(tree, reps * n_bound, rng, tau)
            best = s.log_p.reshape(reps, n_bound).max(axis=1)
            fails = int(np.sum(best < max_log_prob - eps - 1e-12))
            rec.update(empirical_failure=fails / reps, empirical_repeats=reps, failures=fails)
        else:
            rec.update(empirical_failure=None, empirical_repeats=0, failures=0)
        out["max"][str(tau)] = rec
    z = NormalDist().inv_cdf(1 - delta / 2)
    enumerable = tree.n_sequences <= enumeration_limit
    for tau in pe_temperatures:
        log_c = tree_max_log_weight(tree, tau)
        rec = {"log10_c": log_c / math.log(10)}
        # Work in log10 to avoid overflow: N_H = (b-a)^2 C^2 / (2 eps^2) log(2/delta).
        rec["log10_n_hoeffding"] = math.log10(
            entropy_sample_bound(a, b, 1.0, eps, delta)
        ) + 2 * log_c / math.log(10)
        if enumerable:
            lp, lq = enumerate_log_probs(tree, tau)
            q = np.exp(lq)
            x = -importance_weights(lp, lq, clip) * np.where(np.isfinite(lp), lp, 0.0)
            mean = float(np.sum(q * x))
            var = float(np.sum(q * (x - mean) ** 2))
            rec["bias"] = mean - entropy
            rec["sigma"] = math.sqrt(var)
            rec["n_clt"] = max(1, math.ceil((z * math.sqrt(var) / eps) ** 2))
            rec["log10_hoeffding_over_clt"] = rec["log10_n_hoeffding"] - math.log10(rec["n_clt"])
        out["entropy"][str(tau)] = rec
    return out


def _quantiles(x: list[float]) -> dict[str, float | None]:
    arr = np.asarray([v for v in x if v is not None], dtype=np.float64)
    if arr.size == 0:
        return {"n": 0, "min": None, "q50": None, "max": None}
    return {
        "n": int(arr.size),
        "min": float(arr.min()),
        "q50": float(np.median(arr)),
        "max": float(arr.max()),
    }


def summarize_checks(records: list[dict[str, Any]], delta: float) -> dict[str, Any]:
    """Aggregate :func:`check_tree` outputs over distributions (per temperature).

    For the M bound: pooled empirical failure rate (total failures / total repeats), the largest
    per-distribution analytic failure probability (must be <= delta), and how conservative the
    bound is (``N_bound / N_required``). For the H bound: ``log10 N_H`` and ``log10(N_H / N_clt)``.
    """
    out: dict[str, Any] = {
        "n_distributions": len(records),
        "delta": delta,
        "max": {},
        "entropy": {},
    }
    if not records:
        return out
    for tau in records[0]["max"]:
        recs = [r["max"][tau] for r in records]
        fails = sum(r.get("failures", 0) for r in recs)
        reps = sum(r.get("empirical_repeats", 0) for r in recs)
        checked = [r for r in recs if r.get("empirical_repeats", 0) > 0]
        ratio = [r["n_bound"] / r["n_required"] for r in recs if r.get("n_bound")]
        out["max"][tau] = {
            "pooled_empirical_failure": fails / reps if reps else None,
            "n_checked": len(checked),
            "n_unchecked_budget": len(recs) - len(checked),
            "max_analytic_failure": max(r["analytic_failure"] for r in recs),
            "analytic_failure_le_delta": bool(
                all(r["analytic_failure"] <= delta + 1e-12 for r in recs)
            ),
            "n_bound": _quantiles([r.get("n_bound") for r in recs]),
            "n_required": _quantiles([r.get("n_required") for r in recs]),
            "bound_over_required": _quantiles(ratio),
            "q_eps": _quantiles([r["q_eps"] for r in recs]),
            "p_eps": _quantiles([r["p_eps"] for r in recs]),
        }
    for tau in records[0]["entropy"]:
        recs = [r["entropy"][tau] for r in records]
        out["entropy"][tau] = {
            "log10_n_hoeffding": _quantiles([r["log10_n_hoeffding"] for r in recs]),
            "log10_c": _quantiles([r["log10_c"] for r in recs]),
            "n_clt": _quantiles([r.get("n_clt") for r in recs]),
            "log10_hoeffding_over_clt": _quantiles(
                [r.get("log10_hoeffding_over_clt") for r in recs]
            ),
            "clip_bias": _quantiles([r.get("bias") for r in recs]),
        }
    return out
