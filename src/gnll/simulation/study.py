"""The simulation study of Sec. 3 / App. C: estimator quality vs number of samples N.

For every setting ``(|V|, T)`` and distribution ``d`` (independently seeded by ``(seed, V, T, d)``):
draw a Dirichlet prefix tree, compute exact ``H`` and ``M``, then for ``N = 1..N_max``:
PE by multinomial sampling (MS) at each PE temperature, ``M`` by max over MS samples at each MS
temperature, and ``M`` by beam search of width ``N``. The first ``theory_distributions`` trees of
every setting also get the Theorem 1 check (:func:`gnll.simulation.theory.check_tree`).

Why one module of ~580 lines: it is the study's single pipeline (configuration -> per-setting
simulation -> aggregation -> the paper's claims -> results file), read top to bottom in that order;
each step is a short function, and splitting them across files would only add imports between steps
that no other code uses.

Example
-------
>>> cfg = StudyConfig.quick(workers=1, vocab_sizes=(20,), lengths=(2,), distributions=5,
...                         theory_distributions=2)
>>> res = run_study(cfg)
>>> sorted(res["settings"])
['V20_T2']
>>> len(res["settings"]["V20_T2"]["estimators"]["m_beam"]["found_max_fraction"]) == cfg.max_samples
True
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from gnll._util import jsonable
from gnll._util.runfiles import RESULTS
from gnll.simulation.distributions import (
    LeafPool,
    PrefixTreeDistribution,
    exact_values,
    make_leaf_pool,
    sample_tree,
)
from gnll.simulation.estimators import (
    beam_search_estimates,
    max_estimates,
    predictive_entropy_estimates,
    sample_sequences,
)
from gnll.simulation.theory import (
    check_tree,
    summarize_checks,
    tree_log_prob_range,
    tree_max_log_weight,
)

__all__ = [
    "StudyConfig",
    "clear_leaf_pools",
    "estimator_name",
    "leaf_pool",
    "run_study",
    "setting_key",
    "simulate_distributions",
    "summarize_claims",
    "write_results",
]

ProgressFn = Callable[[str, int, int], None]
"""``progress(setting_key, n_done_increment, n_total_for_setting)``."""

_STREAM_TREE, _STREAM_SAMPLES, _STREAM_POOL, _STREAM_THEORY = 0, 1, 2, 3


@dataclass(frozen=True)
class StudyConfig:
    """Configuration of :func:`run_study` (defaults = the paper's study).

    Attributes
    ----------
    vocab_sizes, lengths:
        Settings are their Cartesian product (paper: ``(20, 100) x (2, 3, 4)``).
    distributions:
        Number of random ``p(y)`` per setting (paper: 2000).
    repeats:
        Independent sample sets per distribution (1 = Fig. 1; ``distributions=1, repeats=2000``
        is the appendix's "one p, 2000 runs").
    max_samples:
        ``N_max``; estimates are reported for ``N = 1..N_max`` (and beam widths ``1..N_max``).
    pe_temperatures, ms_temperatures:
        MS temperatures for the PE estimator and for the max-over-samples ``M`` estimator.
    weight_clip:
        Importance weights are clipped to ``[1/clip, clip]`` (App. C: 1e6).
    seed:
        Master seed; distribution ``d`` of setting ``(V, T)`` depends only on ``(seed, V, T, d)``.
    workers:
        Worker processes (1 = run in-process).
    leaf_pool_size, pool_threshold:
        Settings with ``V**T > pool_threshold`` draw their last level from a per-setting pool of
        ``leaf_pool_size`` Dirichlet rows (0 disables the pool: every node fresh, slow for
        V=100, T=4).
    theory_distributions, theory_epsilon, theory_delta, theory_repeats, theory_sample_budget:
        Theorem 1 check on the first ``theory_distributions`` trees of each setting.
    enumeration_limit:
        Trees with at most this many sequences get exact (enumerated) PE variances in the check.
    found_atol:
        ``M`` is "found" when the estimate is within this many nats of the exact value.
    pe_unweighted:
        Also report the *naive* PE ``-mean log p`` of tempered samples without importance weights
        (``pe_ms_naive_tau*``) for every PE temperature != 1 -- a biased, low-variance estimator
        that the paper's Fig. 4 caption ("lower temperature ... lower variance but introduces
        bias") appears to describe.
    """

    vocab_sizes: tuple[int, ...] = (20, 100)
    lengths: tuple[int, ...] = (2, 3, 4)
    distributions: int = 2000
    repeats: int = 1
    max_samples: int = 10
    pe_temperatures: tuple[float, ...] = (1.0, 0.5)
    ms_temperatures: tuple[float, ...] = (1.0, 0.5, 0.1)
    weight_clip: float = 1e6
    seed: int = 0
    workers: int = 2
    leaf_pool_size: int = 2**20
    pool_threshold: int = 10**7
    theory_distributions: int = 100
    theory_epsilon: float = 0.1
    theory_delta: float = 0.1
    theory_repeats: int = 100
    theory_sample_budget: int = 50_000
    enumeration_limit: int = 10**6
    found_atol: float = 1e-8
    pe_unweighted: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_sizes", "lengths", "pe_temperatures", "ms_temperatures"):
            val = tuple(getattr(self, name))
            object.__setattr__(self, name, val)
            if not val:
                raise ValueError(f"{name} must not be empty")
            if len(set(val)) != len(val):
                raise ValueError(f"{name} has duplicates: {val}")
        if any(int(v) != v or v < 2 for v in self.vocab_sizes):
            raise ValueError(f"vocab_sizes must be integers >= 2, got {self.vocab_sizes}")
        if any(int(t) != t or t < 1 for t in self.lengths):
            raise ValueError(f"lengths must be integers >= 1, got {self.lengths}")
        for name in ("pe_temperatures", "ms_temperatures"):
            if any(not (math.isfinite(x) and x > 0) for x in getattr(self, name)):
                raise ValueError(f"{name} must be finite and > 0")
        for name in ("distributions", "repeats", "max_samples", "workers"):
            val = getattr(self, name)
            if int(val) != val or val < 1:
                raise ValueError(f"{name} must be a positive integer, got {val!r}")
        for name in ("leaf_pool_size", "theory_distributions", "theory_repeats", "pool_threshold"):
            val = getattr(self, name)
            if int(val) != val or val < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {val!r}")
        if not self.weight_clip >= 1:
            raise ValueError(f"weight_clip must be >= 1, got {self.weight_clip!r}")
        if not self.theory_epsilon > 0:
            raise ValueError("theory_epsilon must be > 0")
        if not 0 < self.theory_delta < 1:
            raise ValueError("theory_delta must be in (0, 1)")
        if not self.found_atol >= 0:
            raise ValueError("found_atol must be >= 0")
        for v in self.vocab_sizes:
            for t in self.lengths:
                if not self.uses_pool(v, t) and v**t > 10**9:
                    raise ValueError(
                        f"V={v}, T={t}: {v**t} next-token entries do not fit in memory; "
                        "enable the leaf pool (leaf_pool_size > 0, pool_threshold < V**T)"
                    )

    @classmethod
    def quick(cls, **overrides: Any) -> StudyConfig:
        """A small study that runs in a few seconds (tests, README); keyword overrides allowed."""
        base = {
            "vocab_sizes": (20, 100),
            "lengths": (2, 3),
            "distributions": 20,
            "max_samples": 10,
            "theory_distributions": 3,
            "theory_repeats": 50,
            "theory_sample_budget": 10_000,
            "leaf_pool_size": 2**14,
        }
        base.update(overrides)
        return cls(**base)

    def settings(self) -> list[tuple[int, int]]:
        """``[(V, T), ...]`` in run order."""
        return [(int(v), int(t)) for v in self.vocab_sizes for t in self.lengths]

    def uses_pool(self, vocab_size: int, length: int) -> bool:
        """Whether setting ``(V, T)`` draws its last level from a leaf pool."""
        return self.leaf_pool_size > 0 and vocab_size**length > self.pool_threshold and length > 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dict (tuples become lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StudyConfig:
        """Inverse of :meth:`to_dict` (unknown keys are rejected)."""
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown StudyConfig fields: {sorted(unknown)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def setting_key(vocab_size: int, length: int) -> str:
    """Result key of a setting, e.g. ``"V20_T4"``."""
    return f"V{vocab_size}_T{length}"


def estimator_name(kind: str, temperature: float | None = None) -> str:
    """Result key of an estimator, e.g. ``pe_ms_tau0.5``, ``pe_ms_naive_tau0.5``, ``m_beam``."""
    if kind == "beam":
        return "m_beam"
    prefix = {"pe": "pe_ms", "pe_naive": "pe_ms_naive", "m": "m_ms"}[kind]
    return f"{prefix}_tau{temperature:g}"


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))


# Leaf pools live in a module-level cache so forked workers inherit them (copy-on-write).
_LEAF_POOLS: dict[tuple[int, int, int, int], LeafPool] = {}


def leaf_pool(config: StudyConfig, vocab_size: int, length: int) -> LeafPool | None:
    """The setting's shared leaf pool (built on first use and kept), or ``None`` without one."""
    if not config.uses_pool(vocab_size, length):
        return None
    key = (config.seed, vocab_size, length, config.leaf_pool_size)
    if key not in _LEAF_POOLS:
        rng = _rng(config.seed, _STREAM_POOL, vocab_size, length)
        _LEAF_POOLS[key] = make_leaf_pool(vocab_size, config.leaf_pool_size, rng)
    return _LEAF_POOLS[key]


def clear_leaf_pools() -> None:
    """Drop the cached leaf pools (after a setting: each is large)."""
    _LEAF_POOLS.clear()


def _tree(config: StudyConfig, vocab_size: int, length: int, index: int) -> PrefixTreeDistribution:
    rng = _rng(config.seed, _STREAM_TREE, vocab_size, length, index)
    pool = leaf_pool(config, vocab_size, length)
    # Unpooled trees with >= 10**7 stored floats keep their levels in float32 (memory); reads are
    # float64, and exact values and estimators read the same stored numbers.
    dtype = np.float32 if pool is None and vocab_size**length >= 10**7 else np.float64
    return sample_tree(vocab_size, length, rng, leaf_pool=pool, level_dtype=dtype)


def simulate_distributions(
    config: StudyConfig, vocab_size: int, length: int, start: int, stop: int
) -> dict[str, Any]:
    """Simulate distributions ``start..stop-1`` of one setting (the unit of parallel work).

    Returns
    -------
    dict
        ``entropy``/``min_entropy`` ``(n,)``; ``estimates[name]`` ``(n, repeats, N_max)`` for MS
        estimators and ``(n, N_max)`` for ``m_beam``; ``theory``: :func:`check_tree` records.
    """
    n, reps, n_max = stop - start, config.repeats, config.max_samples
    temps = sorted(set(config.pe_temperatures) | set(config.ms_temperatures), reverse=True)
    out: dict[str, Any] = {
        "start": start,
        "entropy": np.empty(n),
        "min_entropy": np.empty(n),
        "estimates": {estimator_name("beam"): np.empty((n, n_max))},
        "theory": [],
    }
    naive = [t for t in config.pe_temperatures if t != 1.0] if config.pe_unweighted else []
    for tau in config.pe_temperatures:
        out["estimates"][estimator_name("pe", tau)] = np.empty((n, reps, n_max))
    for tau in naive:
        out["estimates"][estimator_name("pe_naive", tau)] = np.empty((n, reps, n_max))
    for tau in config.ms_temperatures:
        out["estimates"][estimator_name("m", tau)] = np.empty((n, reps, n_max))
    est = out["estimates"]
    for i, d in enumerate(range(start, stop)):
        tree = _tree(config, vocab_size, length, d)
        ev = exact_values(tree)
        out["entropy"][i], out["min_entropy"][i] = ev.entropy, ev.min_entropy
        rng = _rng(config.seed, _STREAM_SAMPLES, vocab_size, length, d)
        for tau in temps:
            s = sample_sequences(tree, reps * n_max, rng, tau)
            lp, lq = s.log_p.reshape(reps, n_max), s.log_q.reshape(reps, n_max)
            if tau in config.pe_temperatures:
                est[estimator_name("pe", tau)][i] = predictive_entropy_estimates(
                    lp, None if tau == 1.0 else lq, config.weight_clip
                )
            if tau in naive:
                est[estimator_name("pe_naive", tau)][i] = predictive_entropy_estimates(lp)
            if tau in config.ms_temperatures:
                est[estimator_name("m", tau)][i] = max_estimates(lp)
        est[estimator_name("beam")][i] = beam_search_estimates(tree, n_max)
        if d < config.theory_distributions:
            rec = check_tree(
                tree,
                _rng(config.seed, _STREAM_THEORY, vocab_size, length, d),
                max_log_prob=ev.max_log_prob,
                entropy=ev.entropy,
                ms_temperatures=config.ms_temperatures,
                pe_temperatures=config.pe_temperatures,
                eps=config.theory_epsilon,
                delta=config.theory_delta,
                repeats=config.theory_repeats,
                sample_budget=config.theory_sample_budget,
                enumeration_limit=config.enumeration_limit,
                clip=config.weight_clip,
            )
            rec["index"] = d
            out["theory"].append(rec)
    return out


def _stats(x: np.ndarray) -> dict[str, list[float]]:
    """Column statistics of ``x`` with shape ``(n_draws, N)``."""
    q = np.quantile(x, [0.05, 0.5, 0.95], axis=0)
    return {
        "mean": x.mean(axis=0).tolist(),
        "std": x.std(axis=0, ddof=1 if len(x) > 1 else 0).tolist(),
        "q05": q[0].tolist(),
        "q50": q[1].tolist(),
        "q95": q[2].tolist(),
    }


def _scalar_stats(x: np.ndarray) -> dict[str, float]:
    return {k: v[0] for k, v in _stats(x[:, None]).items()}


def _aggregate(config: StudyConfig, parts: list[dict[str, Any]]) -> dict[str, Any]:
    parts = sorted(parts, key=lambda p: p["start"])
    h = np.concatenate([p["entropy"] for p in parts])
    m = np.concatenate([p["min_entropy"] for p in parts])
    res: dict[str, Any] = {
        "exact": {"entropy": _scalar_stats(h), "min_entropy": _scalar_stats(m)},
        "estimators": {},
    }
    for name in parts[0]["estimates"]:
        est = np.concatenate([p["estimates"][name] for p in parts])
        kind = "entropy" if name.startswith("pe") else "min_entropy"
        exact = h if kind == "entropy" else m
        err = est - exact.reshape((-1,) + (1,) * (est.ndim - 1))
        flat_est = est.reshape(-1, est.shape[-1])
        flat_err = err.reshape(-1, err.shape[-1])
        rec: dict[str, Any] = {
            "target": kind,
            "method": "beam" if name == "m_beam" else "ms",
            "temperature": None if name == "m_beam" else float(name.split("tau")[1]),
            "importance_weighted": kind == "entropy" and "naive" not in name,
            "n": list(range(1, est.shape[-1] + 1)),
            "estimate": _stats(flat_est),
            "error": _stats(flat_err),
        }
        if kind == "min_entropy":
            found = np.abs(flat_err) <= config.found_atol
            rec["found_max_fraction"] = found.mean(axis=0).tolist()
        res["estimators"][name] = rec
    theory = [r for p in parts for r in p["theory"]]
    res["theory"] = summarize_checks(theory, config.theory_delta)
    return res


def _poisson_binomial_at_most(probs: list[float], k: int) -> float:
    """P(at most ``k`` of independent events with probabilities ``probs`` occur)."""
    dist = np.zeros(len(probs) + 1)
    dist[0] = 1.0
    for p in probs:
        dist[1:] = dist[1:] * (1 - p) + dist[:-1] * p
        dist[0] *= 1 - p
    return float(dist[: k + 1].sum())


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def summarize_claims(
    results: dict[str, Any], thresholds: tuple[float, ...] = (0.5, 0.9)
) -> dict[str, Any]:
    """Check the paper's two simulation claims against study results.

    Claim 1 (App. C): greedy decoding finds the exact maximum in all settings but one, where beam
    width 2 does. A setting "finds" it when the fraction of distributions is ``>= threshold`` (0.5
    = the median error is 0, which is what the paper's median/quantile plots show). Also reported:
    the probability that, drawing one ``p`` per setting as the appendix does, greedy misses in at
    most one setting.

    Claim 2 (Sec. 3): the PE estimator's spread stays large with ``N`` and grows at lower
    temperature. Reported per setting and temperature: error std and 5-95% width at ``N=1`` and
    ``N_max``, the ``N_max``/``1`` std ratio (``1/sqrt(N_max)`` for an i.i.d. mean), and the ratio
    of the lowest-temperature spread to the ``tau=1`` spread.
    """
    settings = results["settings"]
    c1: dict[str, Any] = {"per_setting": {}, "verdicts": {}}
    for key, s in settings.items():
        beam = s["estimators"]["m_beam"]["found_max_fraction"]
        row = {
            "greedy": beam[0],
            "beam2": beam[1] if len(beam) > 1 else None,
            "beam_max": beam[-1],
            "greedy_median_error": s["estimators"]["m_beam"]["error"]["q50"][0],
        }
        for name, est in s["estimators"].items():
            if est["method"] == "ms" and est["target"] == "min_entropy":
                row[f"{name}_n1"] = est["found_max_fraction"][0]
                row[f"{name}_nmax"] = est["found_max_fraction"][-1]
        c1["per_setting"][key] = row
    greedy = [r["greedy"] for r in c1["per_setting"].values()]
    for thr in thresholds:
        miss = [k for k, r in c1["per_setting"].items() if r["greedy"] < thr]
        rescued = [k for k in miss if (c1["per_setting"][k]["beam2"] or 0) >= thr]
        c1["verdicts"][f"threshold_{thr:g}"] = {
            "greedy_misses": miss,
            "beam2_finds_where_greedy_misses": rescued,
            "holds_all_but_one": len(miss) == 1 and len(rescued) == 1,
            "holds_at_most_one_exception": len(miss) <= 1 and len(rescued) == len(miss),
        }
    c1["prob_greedy_misses_at_most_one_setting_one_p_each"] = _poisson_binomial_at_most(
        [1 - g for g in greedy], 1
    )
    c1["prob_greedy_misses_exactly_one_setting_one_p_each"] = c1[
        "prob_greedy_misses_at_most_one_setting_one_p_each"
    ] - _poisson_binomial_at_most([1 - g for g in greedy], 0)

    c2: dict[str, Any] = {"per_setting": {}}
    for key, s in settings.items():
        pes = {
            n: e
            for n, e in s["estimators"].items()
            if e["target"] == "entropy" and "naive" not in n
        }
        row: dict[str, Any] = {"mean_entropy": s["exact"]["entropy"]["mean"]}
        for name, e in pes.items():
            err = e["error"]
            row[name] = {
                "std_n1": err["std"][0],
                "std_nmax": err["std"][-1],
                "std_ratio_nmax_over_n1": _ratio(err["std"][-1], err["std"][0]),
                "width90_n1": err["q95"][0] - err["q05"][0],
                "width90_nmax": err["q95"][-1] - err["q05"][-1],
                "mean_error_nmax": err["mean"][-1],
                "median_error_nmax": err["q50"][-1],
            }
        temps = sorted(e["temperature"] for e in pes.values())
        if len(temps) > 1 and 1.0 in temps:
            lo, hi = estimator_name("pe", temps[0]), estimator_name("pe", 1.0)
            for stat in ("std_nmax", "width90_nmax", "std_n1"):
                row[f"low_over_tau1_{stat}"] = _ratio(row[lo][stat], row[hi][stat])
        for name, e in s["estimators"].items():
            if "naive" in name:
                err = e["error"]
                row[name] = {
                    "std_n1": err["std"][0],
                    "std_nmax": err["std"][-1],
                    "mean_error_nmax": err["mean"][-1],
                    "median_error_nmax": err["q50"][-1],
                }
        mb = s["estimators"]["m_beam"]["error"]
        row["m_beam_width90_nmax"] = mb["q95"][-1] - mb["q05"][-1]
        row["m_greedy_width90"] = mb["q95"][0] - mb["q05"][0]
        c2["per_setting"][key] = row
    ratios = [r.get("low_over_tau1_std_nmax") for r in c2["per_setting"].values()]
    ratios = [r for r in ratios if r is not None]
    c2["lower_temperature_larger_std_all_settings"] = bool(ratios) and all(r > 1 for r in ratios)
    widths = [r.get("low_over_tau1_width90_nmax") for r in c2["per_setting"].values()]
    widths = [r for r in widths if r is not None]
    c2["lower_temperature_larger_width90_all_settings"] = bool(widths) and all(
        w > 1 for w in widths
    )
    return {"claim1_greedy_finds_max": c1, "claim2_pe_spread": c2}


def run_study(
    config: StudyConfig | None = None, progress: ProgressFn | None = None
) -> dict[str, Any]:
    """Run the whole study and return a JSON-serialisable results dict.

    Parameters
    ----------
    config:
        Study configuration (default :class:`StudyConfig` = the paper's full study).
    progress:
        Optional callback ``progress(setting_key, n_done_increment, n_total)``, called as chunks
        finish.

    Returns
    -------
    dict
        ``{"config", "settings": {key: {...}}, "claims", "wall_time_s", "format_version"}``; see
        ``docs/simulation.md`` for the schema.

    Example
    -------
    See the module docstring.
    """
    config = config or StudyConfig()
    t0 = time.perf_counter()
    settings: dict[str, Any] = {}
    ctx = _mp_context() if config.workers > 1 else None
    for v, t in config.settings():
        key = setting_key(v, t)
        ts = time.perf_counter()
        pool = leaf_pool(config, v, t)
        if pool is not None:  # warm the pooled per-row caches before forking workers
            tree0 = _tree(config, v, t, 0)
            exact_values(tree0)
            tree_log_prob_range(tree0)
            for tau in config.pe_temperatures:
                tree_max_log_weight(tree0, tau)
        chunk = max(1, min(50, math.ceil(config.distributions / (8 * config.workers))))
        bounds = [
            (s, min(s + chunk, config.distributions)) for s in range(0, config.distributions, chunk)
        ]
        parts: list[dict[str, Any]] = []
        if ctx is None:
            for s, e in bounds:
                parts.append(simulate_distributions(config, v, t, s, e))
                if progress:
                    progress(key, e - s, config.distributions)
        else:
            with ProcessPoolExecutor(config.workers, mp_context=ctx) as ex:
                futs = {
                    ex.submit(simulate_distributions, config, v, t, s, e): e - s for s, e in bounds
                }
                for fut in as_completed(futs):
                    parts.append(fut.result())
                    if progress:
                        progress(key, futs[fut], config.distributions)
        res = _aggregate(config, parts)
        settings[key] = {
            "vocab_size": v,
            "length": t,
            "n_sequences": v**t,
            "distributions": config.distributions,
            "repeats": config.repeats,
            "leaf_pool_size": config.leaf_pool_size if pool is not None else None,
            **res,
            "seconds": time.perf_counter() - ts,
        }
        clear_leaf_pools()
    results: dict[str, Any] = {
        "format_version": 1,
        "config": config.to_dict(),
        "settings": settings,
    }
    results["claims"] = summarize_claims(results)
    results["wall_time_s"] = time.perf_counter() - t0
    return results


def _mp_context() -> Any:
    methods = mp.get_all_start_methods()
    # fork shares the leaf pool copy-on-write; elsewhere workers rebuild it from the seed.
    return mp.get_context("fork" if "fork" in methods and os.name == "posix" else "spawn")


def write_results(results: dict[str, Any], output_path: str | Path) -> Path:
    """Write ``results.json`` into directory ``output_path`` (created if needed); return it."""
    out = Path(output_path)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RESULTS
    path.write_text(json.dumps(jsonable(results, nan="none"), indent=1, allow_nan=False))
    return path
