"""Benchmark 4 -- scaling: wall time and peak memory of ``gnll eval`` (G-NLL only) vs questions.

Runs ``gnll eval --tasks triviaqa_short --measures g-nll --limit N`` for N = 100, 200, 400, 800, each
as a fresh child process (peak RSS of exactly that process via ``os.wait4``). Targets:

- time linear in N within 15%: the generation time per question (``greedy`` stage minus model load,
  from the run's ``timings.json``) may vary by at most 15% between sizes; a least-squares line
  ``wall = a + b N`` is also fitted and its largest relative residual reported;
- peak memory flat within 10%: max/min of peak RSS over the sizes <= 1.10 (records stream to disk).

Usage::

    python bench/scaling.py --output bench/results/scaling.json
    python bench/scaling.py --quick --output /tmp/scaling.json
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import common
import numpy as np
from throughput import run_eval


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--sizes", default=None, help="comma list (default 100,200,400,800)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--model", default=common.DEFAULT_MODEL)
    args = ap.parse_args()
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    info = common.machine()
    sizes = (
        [int(s) for s in args.sizes.split(",")]
        if args.sizes
        else ([2, 4] if args.quick else [100, 200, 400, 800])
    )
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in sizes}
    with tempfile.TemporaryDirectory(prefix="gnll-scaling-") as tmp:
        for rep in range(args.repeats):
            for n in sizes if rep % 2 == 0 else sizes[::-1]:
                wd = Path(tmp) / f"n{n}-r{rep}"
                wd.mkdir()
                res = run_eval(n, args.model, wd, ["--no-plots"] if args.quick else None)
                res.pop("records")
                runs[n].append(res)
                print(
                    f"  N={n}: {res['wall_s']:.1f} s, peak RSS {res['peak_rss_mb']:.0f} MB",
                    flush=True,
                )
    rows = []
    for n in sizes:
        wall = statistics.median(r["wall_s"] for r in runs[n])
        gen = statistics.median(r["gen_s"] for r in runs[n])
        rows.append(
            {
                "questions": n,
                "wall s": wall,
                "generation s": gen,
                "generation s/question": gen / n,
                "peak RSS MB": statistics.median(r["peak_rss_mb"] for r in runs[n]),
                "load 1-min": statistics.median(r["load_before"][0] for r in runs[n]),
            }
        )
    ns = np.array(sizes, dtype=float)
    walls = np.array([r["wall s"] for r in rows])
    slope, intercept = np.polyfit(ns, walls, 1)
    fitted = intercept + slope * ns
    per_q = [r["generation s/question"] for r in rows]
    rss = [r["peak RSS MB"] for r in rows]
    summary = {
        "fit_wall_s": {"intercept_s": intercept, "slope_s_per_question": slope},
        "max_rel_residual_of_fit": float(np.max(np.abs(walls - fitted) / fitted)),
        "generation_per_question_spread": max(per_q) / min(per_q),
        "time_linear_within_15pct": max(per_q) / min(per_q) <= 1.15,
        "rss_max_over_min": max(rss) / min(rss),
        "memory_flat_within_10pct": max(rss) / min(rss) <= 1.10,
    }
    print(common.table(rows))
    print(
        f"\nwall = {intercept:.1f} s + {slope:.3f} s x N (max residual "
        f"{summary['max_rel_residual_of_fit']:.1%}); generation s/question max/min "
        f"{summary['generation_per_question_spread']:.3f} (target <= 1.15); peak RSS max/min "
        f"{summary['rss_max_over_min']:.3f} (target <= 1.10)"
    )
    common.finish(
        "scaling",
        args,
        {
            "sizes": sizes,
            "table": rows,
            "summary": summary,
            "runs": {str(k): v for k, v in runs.items()},
        },
        info,
    )


if __name__ == "__main__":
    main()
