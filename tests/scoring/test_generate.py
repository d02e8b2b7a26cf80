"""``gnll generate``: answers + G-NLL for a file of questions, streamed and resumable like ``gnll
score`` (same reader, writer, errors file and resume), each row the answer ``gnll ask`` gives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import gnll
from gnll.calibration import Calibrator
from gnll.cli.main import app
from gnll.scoring.asking import ask
from tests.scoring.test_api_ask import ScriptedModel

runner = CliRunner()


@pytest.fixture
def model(monkeypatch):
    m = ScriptedModel()
    monkeypatch.setattr(gnll, "load_model", lambda name, **kw: m)
    return m


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_generate_answers_each_question_like_ask_and_reports_bad_rows_by_line(tmp_path, model):
    inp = _write(
        tmp_path / "q.jsonl",
        [
            {"id": "a", "question": "Capital of France?", "topic": "geo"},
            {"id": "b", "question": "   "},
            "{not json",
            {"id": "d", "prompt": "no question field"},
            {"id": "e", "question": "Who wrote Hamlet?"},
        ],
    )
    out = tmp_path / "answers.jsonl"
    res = runner.invoke(app, ["generate", "-i", str(inp), "-o", str(out), "--no-progress"])
    assert res.exit_code == 1, res.output  # some rows failed
    rows = _read_jsonl(out)
    assert [r["id"] for r in rows] == ["a", "e"] and [r["input_line"] for r in rows] == [1, 5]
    assert rows[0]["topic"] == "geo"  # extra fields pass through
    expected = ask(ScriptedModel(), "Capital of France?").to_dict()
    assert rows[0]["answer"] == expected["answer"] == "Paris"
    assert rows[0]["g_nll"] == pytest.approx(expected["g_nll"]) == pytest.approx(0.4)
    assert rows[0]["num_tokens"] == 2 and rows[0]["finish_reason"] == "stop"
    errs = _read_jsonl(Path(str(out) + ".errors.jsonl"))
    assert [(e["line"], e.get("id")) for e in errs] == [(2, "b"), (3, None), (4, "d")]
    assert "empty" in errs[0]["error"] and "question" in errs[2]["error"]
    assert "answered 2 questions" in res.stderr


def test_generate_csv_parquet_calibration_and_resume(tmp_path, model):
    import pandas as pd

    df = pd.DataFrame({"question": [f"q{k}?" for k in range(5)], "n": range(5)})
    df.to_parquet(tmp_path / "q.parquet")
    rng = np.random.default_rng(0)
    scores = rng.uniform(0, 3, 200)
    cal = Calibrator(target_coverage=None).fit(
        scores, (rng.uniform(0, 3, 200) > scores).astype(int)
    )
    cal.meta.update(model="scripted")
    cal.save(tmp_path / "cal.json")
    out = tmp_path / "a.csv"
    args = ["generate", "-i", str(tmp_path / "q.parquet"), "-o", str(out), "--no_progress"]
    args += ["--calibration", str(tmp_path / "cal.json"), "--chunk_size", "2"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    got = pd.read_csv(out)
    assert got["n"].tolist() == list(range(5)) and set(got["answer"]) == {"Paris"}
    assert got["p_correct"].tolist() == pytest.approx([float(cal.predict_proba([0.4])[0])] * 5)
    # Resume: cut the output after two rows; only the three missing questions are answered again.
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:3]))
    model.calls.clear()
    res = runner.invoke(app, [*args, "--resume"])
    assert res.exit_code == 0, res.output
    assert pd.read_csv(out)["n"].tolist() == list(range(5))
    assert model.calls["greedy"] == 3 and "2 rows were already done" in res.stderr
