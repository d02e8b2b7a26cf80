"""`gnll score` killed with -9 ten times at random moments, resumed each time, equals one clean run.

The model is the toy stand-in of ``tests/fakes.py`` (a few milliseconds a chunk), so the time goes into
what is under test: the CLI's writing, the torn-line repair and the skip-what-is-done logic of
``--resume``. Each kill comes at a random moment of the scoring itself (start-up is most of a
run's wall time here, so a moment drawn from the wall clock would mostly hit the imports): when
the output has grown to a size drawn uniformly between what is on disk and the finished file.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/, where fakes.py lives
ROWS = 2000
KILLS = 10


def _input(path: Path) -> None:
    rng = random.Random(0)
    with path.open("w", encoding="utf-8") as fh:
        for i in range(ROWS):
            answer = rng.choice("abcXYZ") + "".join(
                rng.choice("abcdefgh XYZ") for _ in range(rng.randint(0, 30))
            )
            row = {"id": f"row-{i}", "question": f"question {i}?", "answer": answer}
            if i == 777:  # a bad row: in the errors file exactly once
                del row["answer"]
            fh.write(json.dumps(row) + "\n")


def _command(inp: Path, out: Path, *, resume: bool) -> list[str]:
    code = (
        f"import sys, gnll; sys.path.insert(0, {str(HERE)!r}); from fakes import ToyModel;"
        "gnll.load_model = lambda name, **kw: ToyModel(delay=0.01);"
        "from gnll.cli.main import app; app()"
    )
    args = ["score", "-i", str(inp), "-o", str(out), "--no-progress", "--chunk-size", "16"]
    return [sys.executable, "-c", code, *args, *(["--resume"] if resume else [])]


def _run(cmd: list[str], out: Path, kill_at: int | None = None) -> bool:
    """Run ``cmd``; SIGKILL it once ``out`` holds ``kill_at`` bytes. True if it was killed."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while proc.poll() is None:
        assert time.monotonic() < deadline, "gnll score did not finish in 300 s"
        if kill_at is not None and out.exists() and out.stat().st_size >= kill_at:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            return True
        time.sleep(0.002)
    err = proc.stderr.read().decode() if proc.stderr else ""
    # exit 1 with "1 row(s) failed": the bad row, reported as it should be
    assert proc.returncode == 0 or "1 row(s) failed" in err, err
    return False


@pytest.mark.e2e
def test_score_killed_ten_times_then_resumed_equals_an_uninterrupted_run(tmp_path):
    inp = tmp_path / "in.jsonl"
    _input(inp)
    ref, out = tmp_path / "ref.jsonl", tmp_path / "out.jsonl"
    _run(_command(inp, ref, resume=False), ref)
    size = ref.stat().st_size

    rng = random.Random(1)
    kills = starts = 0
    killed = True
    while killed:
        starts += 1
        assert starts < 60, "the resumed runs never finished"
        done = out.stat().st_size if out.exists() else 0
        kill_at = int(rng.uniform(done, size)) if kills < KILLS else None
        killed = _run(_command(inp, out, resume=starts > 1), out, kill_at)
        kills += killed
    assert kills == KILLS

    assert out.read_bytes() == ref.read_bytes()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == ROWS - 1
    errors_ref = Path(f"{ref}.errors.jsonl").read_text().splitlines()
    errors = Path(f"{out}.errors.jsonl").read_text().splitlines()
    assert len(errors) == 1 and [json.loads(e)["line"] for e in errors] == [778]
    assert [json.loads(e)["line"] for e in errors_ref] == [778]
