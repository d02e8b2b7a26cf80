"""Benchmark 5 -- the simulation study: time of the default full ``gnll simulate`` run, and where
the time goes at |V|=100, T=4.

1. ``gnll simulate --output_path TMP --no-progress`` with every other option at its default (the
   paper's full study, plots included), as a child process: wall time, peak RSS of the largest
   process, and the per-setting seconds from its ``results.json``.
2. A cProfile of setting V=100, T=4 in-process (default ``StudyConfig``, one worker): ``D``
   distributions with the Theorem-1 check (indices 0..D-1) and ``D`` without it (indices from
   ``theory_distributions`` on), grouped into exact values (``exact_values``: the exact H and M),
   sampling estimators, beam search, the Theorem-1 check and tree sampling. The shares are
   extrapolated to the full setting (``theory_distributions`` trees with the check, the rest without).
   Target: exact enumeration is not the bottleneck.

Usage::

    python bench/simulation.py --output bench/results/simulation.json
    python bench/simulation.py --quick --output /tmp/simulation.json
"""

from __future__ import annotations

import cProfile
import json
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

import common

#: Profile groups: label -> (module file suffix, function name) whose cumulative time is the group's.
GROUPS = {
    "exact values (H, M)": ("distributions.py", "exact_values"),
    "tree sampling": ("study.py", "_tree"),
    "sampling estimators": ("estimators.py", "sample_sequences"),
    "PE / max estimates": ("estimators.py", "predictive_entropy_estimates"),
    "max over samples": ("estimators.py", "max_estimates"),
    "beam search": ("estimators.py", "beam_search_estimates"),
    "Theorem-1 check": ("theory.py", "check_tree"),
}


def grouped(stats: pstats.Stats) -> tuple[dict[str, float], float]:
    cum: dict[str, float] = {}
    total = 0.0
    for (file, _line, func), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        for label, (suffix, name) in GROUPS.items():
            if file.endswith(suffix) and func == name:
                cum[label] = cum.get(label, 0.0) + ct
        if func == "simulate_distributions":
            total += ct
    return cum, total


def profile_setting(config: Any, v: int, t: int, start: int, count: int) -> dict[str, Any]:
    from gnll.simulation.study import leaf_pool, simulate_distributions

    tp = time.perf_counter()
    leaf_pool(config, v, t)  # built once per setting in a real run; timed separately
    pool_s = time.perf_counter() - tp
    prof = cProfile.Profile()
    prof.enable()
    simulate_distributions(config, v, t, start, start + count)
    prof.disable()
    cum, total = grouped(pstats.Stats(prof))
    return {"start": start, "count": count, "pool_s": pool_s, "total_s": total, "groups_s": cum}


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--profile-distributions", type=int, default=None, help="D (default 20)")
    ap.add_argument("--skip-full", action="store_true", help="only the profile")
    args = ap.parse_args()
    common.setup_threads(args.threads)
    info = common.machine()
    from gnll.simulation import StudyConfig
    from gnll.simulation.study import clear_leaf_pools

    out: dict[str, Any] = {}
    if not args.skip_full:
        with tempfile.TemporaryDirectory(prefix="gnll-sim-") as tmp:
            cmd = [*common.gnll_cli(), "simulate", "--output_path", tmp, "--no-progress"]
            if args.quick:
                cmd.append("--quick")
            res = common.run_measured(cmd, log=Path(tmp) / "log.txt")
            if res["returncode"] != 0:
                raise RuntimeError((Path(tmp) / "log.txt").read_text()[-2000:])
            results = json.loads((Path(tmp) / "results.json").read_text())
        res["settings_s"] = {k: s["seconds"] for k, s in results["settings"].items()}
        res["study_wall_s"] = results["wall_time_s"]
        out["full_run"] = res

    d = args.profile_distributions or (1 if args.quick else 20)
    if args.quick:
        config = StudyConfig.quick(vocab_sizes=(100,), lengths=(4,), workers=1)
    else:
        config = StudyConfig(vocab_sizes=(100,), lengths=(4,), workers=1)
    with_theory = profile_setting(config, 100, 4, 0, min(d, max(1, config.theory_distributions)))
    without = profile_setting(config, 100, 4, config.theory_distributions, d)
    clear_leaf_pools()
    n_theory = min(config.theory_distributions, config.distributions)
    n_rest = config.distributions - n_theory
    per_with = {k: v / with_theory["count"] for k, v in with_theory["groups_s"].items()}
    per_without = {k: v / without["count"] for k, v in without["groups_s"].items()}
    est = {
        k: n_theory * per_with.get(k, 0.0) + n_rest * per_without.get(k, 0.0)
        for k in set(per_with) | set(per_without)
    }
    total_est = n_theory * with_theory["total_s"] / with_theory["count"] + n_rest * (
        without["total_s"] / without["count"]
    )
    rows = [
        {
            "component (V=100, T=4)": k,
            "s / distribution (with check)": per_with.get(k, 0.0),
            "s / distribution (without)": per_without.get(k, 0.0),
            "share of setting": est[k] / total_est,
        }
        for k in sorted(est, key=lambda k: -est[k])
    ]
    exact_share = est.get("exact values (H, M)", 0.0) / total_est
    bottleneck = rows[0]["component (V=100, T=4)"] if rows else None
    out["profile_v100_t4"] = {
        "config": config.to_dict(),
        "with_theory": with_theory,
        "without_theory": without,
        "estimated_setting_s": total_est,
        "exact_share": exact_share,
        "bottleneck": bottleneck,
        "exact_is_bottleneck": bottleneck == "exact values (H, M)",
    }
    if "full_run" in out:
        fr = out["full_run"]
        print(
            common.table(
                [
                    {
                        "run": "gnll simulate" + (" --quick" if args.quick else " (defaults)"),
                        "wall s": fr["wall_s"],
                        "peak RSS MB (largest process)": fr["peak_rss_mb"],
                        "load before": fr["load_before"][0],
                        "load after": fr["load_after"][0],
                    }
                ]
            )
        )
        print()
        print(common.table([{"setting": k, "seconds": v} for k, v in fr["settings_s"].items()]))
        print()
    print(common.table(rows))
    print(
        f"\nexact values: {exact_share:.1%} of the V=100, T=4 setting; bottleneck: {bottleneck}; "
        f"leaf pool build {with_theory['pool_s']:.1f} s"
    )
    common.finish("simulation", args, {"table": rows, **out}, info)


if __name__ == "__main__":
    main()
