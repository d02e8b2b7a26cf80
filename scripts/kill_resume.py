#!/usr/bin/env python
"""Kill a real ``gnll eval`` with SIGKILL at random moments, resume it, compare with a clean run.

The reference is one uninterrupted run. Then, round after round, the same run is started in a
fresh directory, killed with ``kill -9`` at a random time drawn uniformly from the reference run's
wall time, and restarted with ``--resume`` until it finishes; its ``samples.jsonl``,
``results.json`` and ``table.md`` must be byte-identical to the reference. Rounds repeat until at
least ``--kills`` kills happened.

Usage (the result in docs/reliability.md)::

    python scripts/kill_resume.py --kills 10 --report kill_resume.json

Extra ``gnll eval`` options may follow ``--``; the defaults are a small SVAMP run with greedy,
beams, samples and clusters, so every stage and cache is exercised. Exit status 1 if any output
differs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

OUTPUTS = ("samples.jsonl", "results.json", "table.md")
DEFAULT_EVAL = [
    "--tasks", "svamp_short", "--limit", "4", "--beams", "2", "--samples", "2",
    "--temperature", "1.0", "--chunk_size", "1", "--clusterer", "exact",
    "--bootstrap", "20", "--no-plots", "--no-progress",
]  # fmt: skip


def _gnll() -> list[str]:
    return [sys.executable, "-c", "from gnll.cli.main import app; app()"]


def _run(cmd: list[str], env: dict[str, str], kill_after: float | None) -> tuple[str, float]:
    """Run ``cmd``; kill -9 it after ``kill_after`` s. Returns ('done'|'killed', seconds)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        proc.wait(timeout=kill_after)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
        return "killed", time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"gnll eval failed (exit {proc.returncode}):\n{err}")
    return "done", time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=10, help="at least this many kill -9s")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill times")
    ap.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: tmp)")
    ap.add_argument("--report", type=Path, default=None, help="write the result as JSON here")
    ap.add_argument("--max_rounds", type=int, default=20)
    ap.add_argument("eval_args", nargs="*", help="gnll eval options (after --)")
    args = ap.parse_args(argv)
    eval_args = args.eval_args or DEFAULT_EVAL
    rng = random.Random(args.seed)
    work = args.workdir or Path(os.environ.get("TMPDIR", "/tmp")) / f"gnll-kill-{os.getpid()}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    env = {**os.environ, "GNLL_NO_PROGRESS": "1"}

    ref = work / "ref"
    _, t_ref = _run([*_gnll(), "eval", *eval_args, "--output_path", str(ref)], env, None)
    print(f"reference run: {t_ref:.1f} s", flush=True)

    kills: list[float] = []
    rounds = []
    while len(kills) < args.kills and len(rounds) < args.max_rounds:
        out = work / f"round{len(rounds)}"
        starts, round_kills = 0, []
        while True:
            resume = ["--resume"] if starts else []
            cmd = [*_gnll(), "eval", *eval_args, "--output_path", str(out), *resume]
            budget = None if len(kills) >= args.kills else rng.uniform(0.0, t_ref)
            status, dt = _run(cmd, env, budget)
            starts += 1
            if status == "done":
                break
            kills.append(round(dt, 2))
            round_kills.append(round(dt, 2))
            print(f"  round {len(rounds)}: kill -9 after {dt:.1f} s", flush=True)
        same = {name: (out / name).read_bytes() == (ref / name).read_bytes() for name in OUTPUTS}
        rounds.append({"kills_at_seconds": round_kills, "starts": starts, "identical": same})
        print(f"round {len(rounds) - 1}: {len(round_kills)} kills, identical: {same}", flush=True)

    ok = len(kills) >= args.kills and all(all(r["identical"].values()) for r in rounds)
    result = {
        "command": "gnll eval " + " ".join(eval_args),
        "reference_seconds": round(t_ref, 1),
        "kills": len(kills),
        "rounds": rounds,
        "all_identical": ok,
    }
    if args.report:
        args.report.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}))
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
