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

pytestmark = pytest.mark.model

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = {
    "overhead": ["table", "bookkeeping", "profile"],
    "cost_per_method": ["table", "raw"],
    "throughput": ["table", "summary"],
    "scaling": ["table", "summary"],
    "simulation": ["table", "profile_v100_t4", "full_run"],
    "load_times": ["loads", "tokens_per_second"],
    "profile_greedy": ["table", "forwards", "profile"],
    "serve_load": ["table", "proxy", "summary"],
}
# Small options on top of --quick where the quick default still does more than a smoke test needs.
EXTRA = {"cost_per_method": ["--questions", "1", "--clusterers", "exact,embedding,nli,llm"]}


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


def test_report_renders_quick_results(results_dir, tmp_path):
    """bench/report.py turns whatever the quick runs above wrote into the BENCHMARKS.md section."""
    if not any(results_dir.glob("*.json")):
        pytest.skip("run together with test_bench_script_runs_quick")
    doc = tmp_path / "BENCH.md"
    doc.write_text("# title\n\nprose\n")
    for _ in range(2):  # the second run replaces the section instead of appending another
        subprocess.run(
            [sys.executable, str(BENCH / "report.py"), "--results", str(results_dir)]
            + ["--update", str(doc)],
            check=True,
            capture_output=True,
            timeout=120,
        )
    text = doc.read_text()
    assert text.startswith("# title") and text.count("bench/report.py: start") == 1
    for name in (p.stem for p in results_dir.glob("*.json")):
        assert f"bench/{name}.py" in text
