"""Issue 15, point 3: the run directory (lock, start-over deletes only gnll's files, run.json)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fakes import FakeModel, cfg

from gnll.evaluation.run.rundir import ForeignFilesError, RunDirectoryBusyError, RunLock
from gnll.evaluation.run.runner import Evaluator, FingerprintMismatchError
from gnll.evaluation.run.store import EarlierRunError

TESTS = str(Path(__file__).resolve().parents[1])  # tests/, where fakes.py lives
SRC = str(Path(__file__).resolve().parents[2] / "src")


SLOW_RUN = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    from fakes import FakeModel, cfg
    from gnll.evaluation.run.runner import Evaluator
    Evaluator(cfg(Path({data!r}), Path({out!r})), model=FakeModel(delay=0.3)).run()
    """
)


@pytest.mark.e2e
def test_second_run_on_a_live_directory_is_refused_and_the_first_finishes(data_dir, tmp_path):
    out = tmp_path / "run"
    ref = tmp_path / "ref"
    Evaluator(cfg(data_dir, ref), model=FakeModel()).run()
    script = SLOW_RUN.format(tests=TESTS, data=str(data_dir), out=str(out))
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while not list(out.glob("tasks/*/cache/greedy-*.jsonl")) and time.time() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, proc.stderr.read().decode()
        for resume in (False, True):  # neither starting over nor resuming may touch a live run
            with pytest.raises(RunDirectoryBusyError, match=r"in use by another gnll run \(pid"):
                Evaluator(cfg(data_dir, out, resume=resume), model=FakeModel()).run()
    finally:
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()
    for name in ("samples.jsonl", "results.json"):
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name
    # the lock died with its process: the directory is free again
    Evaluator(cfg(data_dir, out, resume=True), model=FakeModel()).run()


def test_busy_directory_is_one_line_from_the_cli(data_dir, tmp_path):
    from typer.testing import CliRunner

    from gnll.cli.main import app

    out = tmp_path / "run"
    with RunLock(out):
        result = CliRunner().invoke(
            app,
            ["eval", "--tasks", "svamp_short", "--data_dir", str(data_dir),
             "--output_path", str(out), "--measures", "g-nll"],
        )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and "in use by another gnll run" in result.output
    assert "Traceback" not in result.output


def test_starting_over_never_deletes_files_gnll_did_not_write(data_dir, tmp_path):
    out = tmp_path / "run"
    Evaluator(cfg(data_dir, out, measures=["g-nll"], plots=True), model=FakeModel()).run()
    mine = [out / "plots" / "my-figure.svg", out / "tasks" / "svamp_short" / "notes.txt"]
    for p in mine:
        p.write_text("precious")
    before = sorted(str(p) for p in out.rglob("*"))
    for p in mine:
        with pytest.raises(ForeignFilesError, match=p.name):
            Evaluator(
                cfg(data_dir, out, measures=["g-nll"], overwrite=True), model=FakeModel()
            ).run()
        assert sorted(str(q) for q in out.rglob("*")) == before  # nothing at all was deleted
        p.unlink()
        before = sorted(str(q) for q in out.rglob("*"))
    (out / "README.md").write_text("not an output entry: left alone")
    (out / ".results.json.x1y2.tmp").write_text("left by a killed run")
    Evaluator(cfg(data_dir, out, measures=["g-nll"], overwrite=True), model=FakeModel()).run()
    assert (out / "README.md").read_text() == "not an output entry: left alone"
    assert not (out / ".results.json.x1y2.tmp").exists()
    assert not (out / "plots").exists()  # the earlier run's own figures were removed


def test_symlinked_entries_are_never_followed(data_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "data.csv").write_text("precious")
    out = tmp_path / "run"
    out.mkdir()
    (out / "plots").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ForeignFilesError, match="plots"):
        Evaluator(cfg(data_dir, out, measures=["g-nll"], overwrite=True), model=FakeModel()).run()
    assert (elsewhere / "data.csv").read_text() == "precious"


@pytest.mark.parametrize("finished", [True, False])
def test_an_earlier_run_is_never_deleted_without_overwrite(data_dir, tmp_path, finished):
    from typer.testing import CliRunner

    from gnll.cli.main import app

    out = tmp_path / "run"
    Evaluator(cfg(data_dir, out, measures=["g-nll"]), model=FakeModel()).run()
    if not finished:  # killed before the end: caches but no results
        for name in ("results.json", "samples.jsonl", "table.md"):
            (out / name).unlink()
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(EarlierRunError, match="--overwrite"):
        Evaluator(cfg(data_dir, out, measures=["g-nll"]), model=FakeModel()).run()
    args = ["eval", "--tasks", "svamp_short", "--data_dir", str(data_dir),
            "--output_path", str(out), "--measures", "g-nll"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    kind = "a finished run" if finished else "an unfinished run"
    assert (
        result.output.startswith(f"error: {out} holds {kind}") and "Traceback" not in result.output
    )
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_run_json_is_written_only_after_the_resume_check(data_dir, tmp_path):
    out = tmp_path / "run"
    Evaluator(cfg(data_dir, out, measures=["g-nll"]), model=FakeModel()).run()
    run_json = (out / "run.json").read_bytes()
    with pytest.raises(FingerprintMismatchError):
        Evaluator(
            cfg(data_dir, out, seed=7, measures=["g-nll"], resume=True), model=FakeModel()
        ).run()
    assert (out / "run.json").read_bytes() == run_json  # still describes what the directory holds
    assert json.loads(run_json)["config"]["seed"] == 0
