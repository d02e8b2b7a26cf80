"""`--resume` continues an output only from the input it was written from, and the errors file the
guard talks about is described as what it is.

Before, `gnll score -i reversed.jsonl -o mix.jsonl --resume` appended to an output written from
another file: ids 1-3 twice, three rows never scored, exit 0. The output's own rows (each carries
its input row's fields and `input_line`) are the input's fingerprint.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import ToyModel
from typer.testing import CliRunner

import gnll
from gnll.cli.main import app
from tests.scoring.test_api_ask import ScriptedModel

runner = CliRunner()


@pytest.fixture
def model_for(monkeypatch):
    def use(command: str):
        model = ToyModel() if command == "score" else ScriptedModel()
        monkeypatch.setattr(gnll, "load_model", lambda name, **kw: model)
        return model

    return use


def _write(path: Path, ids: list[int]) -> Path:
    rows = [{"id": i, "question": f"q{i}?", "answer": "abc"[: 1 + i % 3]} for i in ids]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _one_line(res) -> str:
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    return lines[0]


@pytest.mark.parametrize("command", ["score", "generate"])
@pytest.mark.parametrize("suffix", ["jsonl", "csv"])
def test_resume_from_another_input_is_refused_in_one_line(tmp_path, model_for, command, suffix):
    model_for(command)
    out = tmp_path / f"mix.{suffix}"
    three = _write(tmp_path / "three.jsonl", [1, 2, 3])
    ten = _write(tmp_path / "ten.jsonl", list(range(1, 11)))
    reversed_ = _write(tmp_path / "reversed.jsonl", list(range(10, 0, -1)))
    args = [command, "-o", str(out), "--no_progress"]
    assert runner.invoke(app, [*args, "-i", str(three)]).exit_code == 0
    before = out.read_bytes()

    res = runner.invoke(app, [*args, "-i", str(reversed_), "--resume"])
    assert res.exit_code == 2, res.output
    line = _one_line(res)
    assert "was written from another input" in line and "input line 1" in line
    assert "nothing was changed" in line and "--overwrite" in line
    assert "--debug" not in line
    assert out.read_bytes() == before

    # The input it was written from, grown by seven rows, resumes: no row twice, none lost.
    res = runner.invoke(app, [*args, "-i", str(ten), "--resume"])
    assert res.exit_code == 0, res.output
    if suffix == "jsonl":
        rows = [json.loads(x) for x in out.read_text().splitlines()]
    else:
        import csv

        rows = list(csv.DictReader(out.open()))
    assert [int(r["id"]) for r in rows] == list(range(1, 11))


def test_an_input_shorter_than_the_output_is_another_input(tmp_path, model_for):
    model_for("score")
    out = tmp_path / "o.jsonl"
    assert (
        runner.invoke(
            app, ["score", "-i", str(_write(tmp_path / "a.jsonl", [1, 2, 3])), "-o", str(out)]
        ).exit_code
        == 0
    )
    short = _write(tmp_path / "b.jsonl", [1, 2])
    res = runner.invoke(app, ["score", "-i", str(short), "-o", str(out), "--resume"])
    assert res.exit_code == 2
    assert "holds a row for input line 3, but" in _one_line(res) and "has 2 lines" in res.stderr


def test_a_foreign_errors_file_is_never_taken_for_a_run(tmp_path, model_for):
    model_for("score")
    inp = _write(tmp_path / "in.jsonl", [1])
    notes = tmp_path / "notes.txt"
    notes.write_text("my precious notes\n")
    for extra in ([], ["--overwrite"], ["--resume"]):
        res = runner.invoke(
            app,
            [
                "score",
                "-i",
                str(inp),
                "-o",
                str(tmp_path / "m2.jsonl"),
                "--errors",
                str(notes),
                *extra,
            ],
        )
        assert res.exit_code == 2, (extra, res.output)
        assert "is not a gnll errors file" in _one_line(res) and "earlier run" not in res.stderr
        assert notes.read_text() == "my precious notes\n"


def test_a_stale_errors_file_alone_says_the_output_does_not_exist(tmp_path, model_for):
    model_for("score")
    inp = _write(tmp_path / "in.jsonl", [1])
    out = tmp_path / "m2.jsonl"
    Path(str(out) + ".errors.jsonl").write_text(
        '{"line": 4, "error": "field \'answer\' is empty"}\n'
    )
    res = runner.invoke(app, ["score", "-i", str(inp), "-o", str(out)])
    assert res.exit_code == 2
    line = _one_line(res)
    assert "m2.jsonl does not exist" in line and "holds an earlier run" not in line


def test_generate_checks_the_csv_header_before_loading_the_model(tmp_path, monkeypatch):
    def never(name, **kw):
        raise AssertionError("the model was loaded before the header was checked")

    monkeypatch.setattr(gnll, "load_model", never)
    csv_in = tmp_path / "q.csv"
    csv_in.write_text("id,text\n1,Who?\n")
    res = runner.invoke(app, ["generate", "-i", str(csv_in), "-o", str(tmp_path / "o.jsonl")])
    assert res.exit_code == 2, res.output
    assert "has no 'question' column" in _one_line(res)
    assert not (tmp_path / "o.jsonl").exists()
