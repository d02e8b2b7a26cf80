"""Every ``bench/`` script runs end to end with ``--quick`` and writes its JSON.

Only that they run is checked here (their figures come from full runs, see BENCHMARKS.md); the whole
file takes about two minutes on an idle 2-core machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = {
    "overhead": ["table", "bookkeeping", "profile"],
    "cost_per_method": ["table", "raw"],
    "throughput": ["table", "summary"],
    "scaling": ["table", "summary"],
    "simulation": ["table", "profile_v100_t4", "full_run"],
    "load_times": ["loads", "tokens_per_second"],
    "profile_greedy": ["table", "forwards", "profile"],
    "beam_stage": ["table", "summary", "timing"],
    "eval_speed": ["table", "summary", "runs"],
    "prefix_attention": ["table"],
    "serve_load": ["table", "proxy", "summary"],
    "stop_split": ["table", "summary"],
    "continuous_batching": ["table", "summary"],
    "distributed": ["median_s", "ray_overhead", "scaling_efficiency", "sizing"],
    "early_decisions": ["summary", "per_question"],
    "early_proxy_escalate": ["summary", "per_question"],
    "decisions": ["summary", "table", "timing", "models"],
}
# Small options on top of --quick where the quick default still does more than a smoke test needs.
EXTRA = {
    "cost_per_method": ["--questions", "1", "--clusterers", "exact,embedding,nli,llm"],
    "eval_speed": ["--heldout", "2", "--arms", "after,options"],
    "early_decisions": ["--n", "2"],
    "early_proxy_escalate": ["--n", "2", "--start", "0"],
    "decisions": ["--models", "smollm2-135m-instruct"],
}


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("bench-results")


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_bench_script_runs_quick(name, results_dir):
    out = results_dir / f"{name}.json"
    cmd = [sys.executable, str(BENCH / f"{name}.py"), "--quick", "--output", str(out)]
    env = {**os.environ, "GNLL_NO_PROGRESS": "1"}
    proc = subprocess.run(
        cmd + EXTRA.get(name, []), capture_output=True, text=True, env=env, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["benchmark"] == name and data["quick"] is True
    assert data["machine"]["nproc"] >= 1
    for key in SCRIPTS[name]:
        assert key in data, f"{name}: missing {key!r}"
    assert "|" in proc.stdout  # printed its table


@pytest.mark.parametrize("source", ["committed", "quick"])
def test_report_renders_results(source, results_dir, tmp_path):
    """bench/report.py turns a results folder into the BENCHMARKS.md section: the committed full-run
    results (always there), and whatever quick runs of this session wrote (they may run later, so
    one script is run here when the folder is still empty: no dependence on test order)."""
    if source == "committed":
        folder = BENCH / "results"
    else:
        folder = results_dir
        if not any(folder.glob("*.json")):
            test_bench_script_runs_quick("load_times", folder)
    # The scripts of the BENCHMARKS.md section (bench/score_memory.py reports in docs/scoring.md).
    found = {json.loads(p.read_text())["benchmark"] for p in folder.glob("*.json")}
    names = sorted(found & set(SCRIPTS))
    assert names
    doc = tmp_path / "BENCH.md"
    doc.write_text("# title\n\nprose\n")
    for _ in range(2):  # the second run replaces the section instead of appending another
        subprocess.run(
            [sys.executable, str(BENCH / "report.py"), "--results", str(folder)]
            + ["--update", str(doc)],
            check=True,
            capture_output=True,
            timeout=120,
        )
    text = doc.read_text()
    assert text.startswith("# title\n\nprose") and text.count("bench/report.py: start") == 1
    for name in names:
        assert f"bench/{name}.py" in text, name
