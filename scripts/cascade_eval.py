"""A cascade of two models gated by the small one's G-NLL, against random escalation, in both orders.

    python scripts/cascade_eval.py RUN_A RUN_B [--targets 0.10,0.12] [--out docs/img/cascade.json]

RUN_A and RUN_B are ``gnll eval`` runs of two models over the same questions (e.g. ``--tasks
triviaqa_short --limit 200 --measures g-nll --beams 0 --samples 0``). For each order (A answers
first, then B first) it reports, at escalation rates 10-50%: the cascade's accuracy when the
questions with the highest G-NLL are escalated, the expected accuracy when the same number are
escalated at random, and the difference with its bootstrap standard error (questions resampled,
both arms on the same resample). It then checks the finite-sample guarantee of
:func:`gnll.calibration.cascade.cascade_threshold` by simulation: the run's questions are the
population; thresholds are fitted on draws of as many questions with replacement; the rate at which
a certified threshold misses the target on the population must stay below delta. It writes one PNG
per order next to ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from gnll.calibration.cascade import (
    accuracy_at_rate,
    cascade_plot,
    cascade_threshold,
    guarantee_violation_rate,
    load_cascade,
    random_accuracy_at_rate,
)

RATES = (0.1, 0.2, 0.3, 0.4, 0.5)


def gap_se(data, rate: float, n_boot: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    n = len(data.scores)
    diffs = []
    for _ in range(n_boot):
        i = rng.integers(0, n, n)
        s, a, b = data.scores[i], data.small[i], data.large[i]
        diffs.append(accuracy_at_rate(s, a, b, rate) - random_accuracy_at_rate(a, b, rate))
    return float(np.std(diffs, ddof=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path)
    ap.add_argument("--targets", default="", help="Target accuracy per order (default: halfway).")
    ap.add_argument("--delta", type=float, default=0.1)
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("docs/img/cascade.json"))
    args = ap.parse_args()
    targets = [float(t) for t in args.targets.split(",") if t]
    out = []
    for k, (small, large) in enumerate(((args.run_a, args.run_b), (args.run_b, args.run_a))):
        data = load_cascade(small, large)
        acc_s, acc_l = float(data.small.mean()), float(data.large.mean())
        # default target: halfway between the two models' accuracies
        target = targets[k] if k < len(targets) else round((acc_s + acc_l) / 2, 3)
        fitted = cascade_threshold(
            data.scores, data.small, data.large, target=target, delta=args.delta
        )
        sim = guarantee_violation_rate(
            data.scores,
            data.small,
            data.large,
            target=target,
            delta=args.delta,
            n_cal=len(data.scores),
            draws=args.draws,
            seed=args.seed,
        )
        rows = []
        for r in RATES:
            gated = accuracy_at_rate(data.scores, data.small, data.large, r)
            rand = random_accuracy_at_rate(data.small, data.large, r)
            se = gap_se(data, r, args.bootstrap, args.seed)
            rows.append(
                {"rate": r, "gated": gated, "random": rand, "gap": gated - rand, "gap_se": se}
            )
        png = args.out.with_name(f"cascade-{data.small_model}-to-{data.large_model}.png")
        png.parent.mkdir(parents=True, exist_ok=True)
        cascade_plot(data, png, fitted=fitted)
        out.append(
            {
                "small": data.small_model,
                "large": data.large_model,
                "n": len(data.keys),
                "accuracy_small": acc_s,
                "accuracy_large": acc_l,
                "at_rates": rows,
                "target": target,
                "delta": args.delta,
                "fitted": fitted.to_dict(),
                "simulation": sim,
                "plot": png.name,
            }
        )
        print(
            f"\n{data.small_model} -> {data.large_model} (n={len(data.keys)}; accuracy "
            f"{acc_s:.3f} alone, {acc_l:.3f} escalating all)"
        )
        print("| escalated | gated by G-NLL | random | gap ± SE |")
        print("|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['rate']:.0%} | {r['gated']:.3f} | {r['random']:.3f} | "
                f"{r['gap']:+.3f} ± {r['gap_se']:.3f} |"
            )
        print(
            f"target {target:g}, delta {args.delta:g}: "
            + (
                f"escalate when G-NLL > {fitted.threshold:.4g} (escalation rate "
                f"{fitted.escalation_rate:.3f}, accuracy {fitted.accuracy:.3f})"
                if fitted.achievable
                else "out of reach"
            )
            + f"; simulation: {sim['draws']} draws of {sim['n_cal']}, certified "
            f"{sim['certified_rate']:.3f}, violation rate {sim['violation_rate']:.3f}"
        )
    args.out.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
