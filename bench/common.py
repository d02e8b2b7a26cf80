"""Shared helpers of the ``bench/`` scripts: prompts, timing, memory, machine facts, JSON, tables.

Every script takes ``--quick`` (a smoke-sized run) and ``--output PATH`` (JSON), prints a small table
and records the machine and the load average next to its figures, because absolute times on a shared
2-core machine drift: the scripts interleave the arms they compare (A, B, A, B, ...) and report
medians and ratios taken within one run.

Scripts are run from the repository root as ``python bench/NAME.py``; this module is imported as
``common`` (the script's directory is first on ``sys.path``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = "smollm2-135m-instruct"


# ---------------------------------------------------------------------------- arguments
def parser(description: str | None) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark shares."""
    ap = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="smoke-sized run (seconds, not minutes)")
    ap.add_argument("--output", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's own choice, one per core)",
    )
    return ap


def setup_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


# ---------------------------------------------------------------------------- machine
def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _lscpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return platform.processor()
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _mem_total_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    """The facts a figure needs next to it: CPU, cores, memory, versions, threads, load."""
    import torch
    import transformers

    return {
        "cpu": _lscpu_model(),
        "nproc": os.cpu_count(),
        "mem_total_gb": _mem_total_gb(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "load_average_start": load_average(),
    }


# ---------------------------------------------------------------------------- prompts
def triviaqa_prompts(n: int) -> list[str]:
    """The first ``n`` TriviaQA short prompts of the evaluation pool, exactly as ``gnll eval`` builds them."""
    from gnll.evaluation.data.tasks import get_task

    td = get_task("triviaqa_short").load()
    return [td.prompt(ex) for ex in td.split("eval", n)]


def triviaqa_questions(n: int) -> list[str]:
    from gnll.evaluation.data.tasks import get_task

    td = get_task("triviaqa_short").load()
    return [ex.question for ex in td.split("eval", n)]


# ---------------------------------------------------------------------------- timing
def interleave(
    arms: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1
) -> dict[str, dict[str, Any]]:
    """Run every arm ``repeats`` times, alternating arms (A B A B ...), and summarise.

    Interleaving puts A and B under the same background load; the order is reversed on every
    other round so that neither arm always runs right after the other. Returns per arm the list of
    seconds, their median, and the load average around each repetition.
    """
    names = list(arms)
    for _ in range(warmup):
        for name in names:
            arms[name]()
    out: dict[str, dict[str, Any]] = {n: {"seconds": [], "load_1min": []} for n in names}
    for rep in range(repeats):
        for name in names if rep % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            arms[name]()
            out[name]["seconds"].append(time.perf_counter() - t)
            out[name]["load_1min"].append(round(os.getloadavg()[0], 2))
    for name in names:
        out[name]["median_s"] = statistics.median(out[name]["seconds"])
    return out


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Median of per-repetition ratios a_i / b_i and the ratio of medians."""
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    return {
        "ratio_of_medians": statistics.median(a) / statistics.median(b),
        "median_paired_ratio": statistics.median(ratios),
        "min_paired_ratio": min(ratios),
        "max_paired_ratio": max(ratios),
    }


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_measured(
    cmd: Sequence[str], *, env: dict[str, str] | None = None, log: Path | None = None
) -> dict[str, Any]:
    """Run ``cmd`` as a child; return wall time, the child's own peak RSS and its return code.

    ``os.wait4`` reports the resource usage of exactly this child (``RUSAGE_CHILDREN`` would be the
    maximum over every child ever waited for), so each run gets its own peak memory.
    """
    full_env = {**os.environ, **(env or {})}
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    t = time.perf_counter()
    load_before = load_average()
    try:
        proc = subprocess.Popen(list(cmd), env=full_env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if log:
            out.close()
    wall = time.perf_counter() - t
    return {
        "cmd": shlex.join(cmd),
        "wall_s": wall,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "user_s": usage.ru_utime,
        "sys_s": usage.ru_stime,
        "returncode": proc.returncode,
        "load_before": load_before,
        "load_after": load_average(),
    }


def gnll_cli() -> list[str]:
    """How to start the ``gnll`` CLI of this interpreter (works without the console script)."""
    return [sys.executable, "-c", "import sys; from gnll.cli.main import app; sys.exit(app())"]


# ---------------------------------------------------------------------------- model counters
class ForwardCounter:
    """Counts forward calls of a model and the token positions they process (rows x columns).

    Forward calls are the latency-bound unit on CPU (one pass over the weights each); processed
    positions are the compute-bound unit (a batch of 10 rows x 1 column is 10 positions).
    """

    def __init__(self, module: Any) -> None:
        self.calls = 0
        self.positions = 0
        self.seconds = 0.0  # inside forward calls (the rest of a method's time is bookkeeping)
        self.shapes: list[tuple[int, int, float]] = []  # (rows, columns, seconds) per call
        self._t = 0.0
        self._shape = (0, 0)
        self._handles = [
            module.register_forward_pre_hook(self._pre, with_kwargs=True),
            module.register_forward_hook(self._post),
        ]

    def _pre(self, module: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.calls += 1
        if ids is not None:
            self.positions += int(ids.numel())
            self._shape = (int(ids.shape[0]), int(ids.shape[1]))
        self._t = time.perf_counter()

    def _post(self, module: Any, args: tuple, output: Any) -> None:
        dt = time.perf_counter() - self._t
        self.seconds += dt
        self.shapes.append((*self._shape, dt))

    def reset(self) -> None:
        self.calls = 0
        self.positions = 0
        self.seconds = 0.0
        self.shapes = []

    def close(self) -> None:
        for h in self._handles:
            h.remove()


@contextmanager
def counting(module: Any) -> Iterator[ForwardCounter]:
    counter = ForwardCounter(module)
    try:
        yield counter
    finally:
        counter.close()


# ---------------------------------------------------------------------------- profiling
def profile_top(fn: Callable[[], Any], n: int = 15) -> list[str]:
    """The ``n`` functions with the most own time while ``fn()`` runs (cProfile lines)."""
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(n)
    lines = [ln.rstrip() for ln in buf.getvalue().splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    return lines[start : start + n + 1]


# ---------------------------------------------------------------------------- output
def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A Markdown table of ``rows`` (dicts) -- printed by the scripts, pasted into BENCHMARKS.md."""
    if not rows:
        return "(no rows)"
    columns = list(columns or rows[0].keys())
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def finish(
    name: str, args: argparse.Namespace, results: dict[str, Any], info: dict[str, Any]
) -> None:
    """Attach machine facts and the command, print, and write the JSON."""
    info["load_average_end"] = load_average()
    results = {
        "benchmark": name,
        "command": shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
        "quick": bool(args.quick),
        "machine": info,
        **results,
    }
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"wrote {args.output}")
