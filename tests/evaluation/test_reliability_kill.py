"""Issue 15: kill -9 a real ``gnll eval`` at random moments, resume, and get byte-identical outputs.

The cheap version of ``scripts/kill_resume.py`` (3 kills on a tiny run); the 10-kill result is in
docs/reliability.md with its command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.model
@pytest.mark.e2e
def test_kill_9_at_random_points_then_resume_is_byte_identical(tmp_path, smollm):
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    args = ["--tasks", "svamp_short", "--limit", "2", "--beams", "2", "--samples", "2",
            "--temperature", "1.0", "--chunk_size", "2", "--clusterer", "exact",
            "--bootstrap", "20", "--no-plots", "--no-progress"]  # fmt: skip
    cmd = [sys.executable, str(ROOT / "scripts" / "kill_resume.py"), "--kills", "3", "--seed", "3",
           "--workdir", str(tmp_path / "work"), "--report", str(report), "--", *args]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(report.read_text())
    assert result["kills"] >= 3 and result["all_identical"] is True
    for r in result["rounds"]:
        assert all(r["identical"].values()), r
