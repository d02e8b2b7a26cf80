"""`gnll score` streams: peak RSS on a 1M-row file against a 100k-row file, side by side.

A stand-in model with no weights (log p of each character, microseconds a row) isolates the IO layer:
reading, checking, writing and resuming rows. Each size runs in a fresh subprocess, alternating
small/large, and the script reports peak RSS (``ru_maxrss``) and rows/s; constant memory means the
ratio large/small stays near 1 (it would be ~10 if rows were kept).

    python bench/score_memory.py [--rows 1000000] [--quick] [--output bench/results/score_memory.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
from gnll.backends.base import Capabilities, Model, ScoredAnswer
from gnll.scoring import ScoreJob, run_score_job

class Fake(Model):
    name = "fake"
    capabilities = Capabilities(scoring=True)
    def render_prompt(self, p): return p
    def generate(self, *a, **k): raise NotImplementedError
    def score(self, prompts, answers, **kw):
        return [ScoredAnswer(a, [ord(c) for c in a], list(a), [-0.1 * (1 + ord(c) % 7) for c in a], True, True)
                for a in answers]

inp, out = sys.argv[1], sys.argv[2]
t = time.perf_counter()
s = run_score_job(Fake(), ScoreJob(inp, out, "jsonl", "jsonl", None, progress=False))
dt = time.perf_counter() - t
print(json.dumps({"rows": s.scored, "seconds": dt, "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def make_input(path: Path, n: int) -> None:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(
                json.dumps(
                    {
                        "id": i,
                        "question": f"Question number {i}?",
                        "answer": "abcdefgh"[: 1 + i % 8],
                    }
                )
                + "\n"
            )


def run(inp: Path, out: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(inp), str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="100k vs 10k rows, one repeat")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args()
    large = 100_000 if args.quick else args.rows
    small = large // 10
    repeats = 1 if args.quick else args.repeats
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        make_input(d / "small.jsonl", small)
        make_input(d / "large.jsonl", large)
        res: dict[str, list] = {"small": [], "large": []}
        for _ in range(repeats):  # interleaved: both sizes see the same machine load
            for name in ("small", "large"):
                res[name].append(run(d / f"{name}.jsonl", d / f"{name}.out.jsonl"))
    rss = {k: min(r["maxrss_mb"] for r in v) for k, v in res.items()}
    rate = {k: max(r["rows"] / r["seconds"] for r in v) for k, v in res.items()}
    summary = {
        "benchmark": "score_memory",
        "quick": args.quick,
        "rows": {"small": small, "large": large},
        "peak_rss_mb": rss,
        "rss_ratio_large_over_small": rss["large"] / rss["small"],
        "rows_per_second": rate,
        "raw": res,
        "machine": {
            "python": platform.python_version(),
            "load_avg": list(__import__("os").getloadavg()),
        },
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "self_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print("| rows | peak RSS (MB) | rows/s |\n|---|---|---|")
    for k in ("small", "large"):
        print(f"| {summary['rows'][k]:,} | {rss[k]:.0f} | {rate[k]:,.0f} |")
    print(f"RSS ratio {large:,} / {small:,} rows: {summary['rss_ratio_large_over_small']:.2f}")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
