"""`gnll score` / `gnll generate` never destroy a user's file: not their own input (also through a
symlink or a hard link), not an earlier run's output or errors file (refused without --resume or
--overwrite, with one line saying what is there), and a crashed run leaves only whole rows of
itself, which --resume completes to the bytes of an uninterrupted run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fakes import ToyModel
from typer.testing import CliRunner

import gnll
from gnll.cli.main import app
from gnll.scoring import ScoreJob, run_score_job
from gnll.scoring.stream import score_chunk
from tests.scoring.test_api_ask import ScriptedModel

runner = CliRunner()


@pytest.fixture
def toy(monkeypatch):
    model = ToyModel()
    monkeypatch.setattr(gnll, "load_model", lambda name, **kw: model)
    return model


@pytest.fixture
def model_for(monkeypatch):
    """Patch load_model with the model a command can run: score teacher-forces (the toy model),
    generate answers (the scripted one)."""

    def use(command: str):
        model = ToyModel() if command == "score" else ScriptedModel()
        monkeypatch.setattr(gnll, "load_model", lambda name, **kw: model)
        return model

    return use


def _rows(path: Path, n: int, bad: int | None = None) -> Path:
    rows = []
    for i in range(n):
        row = {"id": f"r{i}", "question": f"q{i}?", "answer": "abc"[: 1 + i % 3]}
        if i == bad:
            del row["answer"]
            row["question"] = ""
        rows.append(json.dumps(row) + "\n")
    path.write_text("".join(rows), encoding="utf-8")
    return path


COMMANDS = ["score", "generate"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("link", ["same", "symlink", "hardlink"])
def test_output_that_is_the_input_is_refused_and_the_input_kept(tmp_path, model_for, command, link):
    model_for(command)
    inp = _rows(tmp_path / "same.jsonl", 10)
    before = inp.read_bytes()
    out = inp
    if link == "symlink":
        out = tmp_path / "alias.jsonl"
        out.symlink_to(inp)
    elif link == "hardlink":
        out = tmp_path / "hard.jsonl"
        os.link(inp, out)
    res = runner.invoke(app, [command, "-i", str(inp), "-o", str(out), "--no_progress"])
    assert res.exit_code == 2, res.output
    assert "is the input file" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert inp.read_bytes() == before
    # --overwrite does not make it allowed, and neither does naming the input as the errors file
    res = runner.invoke(
        app, [command, "-i", str(inp), "-o", str(out), "--no_progress", "--overwrite"]
    )
    assert res.exit_code == 2 and inp.read_bytes() == before
    res = runner.invoke(
        app,
        [command, "-i", str(inp), "-o", str(tmp_path / "o.jsonl"), "--errors", str(out)],
    )
    assert res.exit_code == 2 and "is the input file" in res.stderr
    assert inp.read_bytes() == before


@pytest.mark.parametrize("command", COMMANDS)
def test_an_earlier_output_and_its_errors_file_are_refused_without_resume_or_overwrite(
    tmp_path, model_for, command
):
    model_for(command)
    inp = _rows(tmp_path / "in.jsonl", 10, bad=3)
    out = tmp_path / "run.jsonl"
    errors = Path(str(out) + ".errors.jsonl")
    args = [command, "-i", str(inp), "-o", str(out), "--no_progress"]
    assert runner.invoke(app, args).exit_code == 1  # one bad row
    kept = out.read_bytes(), errors.read_bytes()
    assert len(out.read_text().splitlines()) == 9 and errors.exists()

    two = _rows(tmp_path / "two.jsonl", 2)
    res = runner.invoke(app, [command, "-i", str(two), "-o", str(out), "--no_progress"])
    assert res.exit_code == 2, res.output
    line = " ".join(res.stderr.split())
    assert f"{out} holds an earlier run (9 rows; 1 failed row in {errors})" in line
    assert "nothing was changed" in line and "--resume" in line and "--overwrite" in line
    assert (out.read_bytes(), errors.read_bytes()) == kept

    # An errors file alone (every row failed: the output is empty) is an earlier run too.
    out.write_bytes(b"")
    res = runner.invoke(app, [command, "-i", str(two), "-o", str(out), "--no_progress"])
    assert res.exit_code == 2 and errors.read_bytes() == kept[1]

    # --overwrite replaces both: the new run has no bad row, so no errors file is left.
    res = runner.invoke(
        app, [command, "-i", str(two), "-o", str(out), "--no_progress", "--overwrite"]
    )
    assert res.exit_code == 0, res.output
    assert len(out.read_text().splitlines()) == 2 and not errors.exists()
    res = runner.invoke(app, [*args, "--overwrite", "--resume"])
    assert res.exit_code == 2 and "not both" in res.stderr


def test_csv_output_rows_are_counted_without_the_header(tmp_path, toy):
    from gnll.scoring.output import OutputExistsError, check_output

    inp = _rows(tmp_path / "in.jsonl", 4)
    out = tmp_path / "s.csv"
    assert runner.invoke(app, ["score", "-i", str(inp), "-o", str(out)]).exit_code == 0
    with pytest.raises(OutputExistsError, match=r"holds an earlier run \(4 rows\)"):
        check_output(str(inp), str(out), Path(str(out) + ".errors.jsonl"), "csv")


def test_a_crash_under_overwrite_leaves_whole_rows_of_the_new_run_that_resume_completes(tmp_path):
    """The earlier output is replaced, never mixed: after a crash mid-run the file holds only the new
    run's first rows (whole lines), and --resume makes it byte-identical to a clean run."""
    inp = _rows(tmp_path / "in.jsonl", 40, bad=25)
    out, clean = tmp_path / "out.jsonl", tmp_path / "clean.jsonl"
    job = dict(input=str(inp), input_format="jsonl", output_format="jsonl", progress=False)
    run_score_job(ToyModel(), ScoreJob(output=str(clean), errors=None, chunk_size=8, **job))
    old = _rows(tmp_path / "old.jsonl", 60)
    errors = Path(str(out) + ".errors.jsonl")
    run_score_job(
        ToyModel(), ScoreJob(output=str(out), errors=errors, **{**job, "input": str(old)})
    )
    model = ToyModel()

    def crash_after_two(todo):
        for k, (chunk, first) in enumerate(todo):
            if k == 2:
                raise KeyboardInterrupt
            yield score_chunk(model, spec, chunk, first)

    spec = ScoreJob(output=str(out), errors=errors, chunk_size=8, overwrite=True, **job)
    with pytest.raises(KeyboardInterrupt):
        run_score_job(None, spec, map_chunks=crash_after_two)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["input_line"] for r in rows] == list(range(1, 17))  # new rows only, no old ones
    spec = ScoreJob(output=str(out), errors=errors, chunk_size=8, resume=True, **job)
    summary = run_score_job(model, spec)
    assert summary.skipped_resume == 16 and summary.failed == 1
    assert out.read_bytes() == clean.read_bytes()
