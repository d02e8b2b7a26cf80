"""`gnll score`'s IO layer with a toy model: formats, bad rows, resume after a kill, constant memory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from fakes import CONTEXT, ToyModel
from typer.testing import CliRunner

import gnll
from gnll.calibration import Calibrator
from gnll.cli.main import app
from gnll.evaluation.data.prompts import ask_prompt
from gnll.scoring import ScoreJob, run_score_job

HERE = Path(__file__).resolve().parents[1]  # tests/, where fakes.py lives


@pytest.fixture
def toy(monkeypatch):
    model = ToyModel()
    monkeypatch.setattr(gnll, "load_model", lambda name, **kw: model)
    return model


def _toy_nll(answer: str) -> float:
    return sum(0.1 * (1 + ord(c) % 7) for c in answer)


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _write_jsonl(path: Path, rows: list) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_round_trip_jsonl_with_bad_rows(tmp_path, toy):
    inp = tmp_path / "in.jsonl"
    rows = [
        {"id": "a", "question": "Capital of France?", "answer": "paris", "correct": True},
        {"id": "b", "prompt": "Q: 2+2?\nA:", "answer": "Four"},
        {"id": "c", "question": "no answer here"},
        {"id": "d", "question": "Empty?", "answer": "  "},
        {"id": "e", "answer": "orphan"},
        {"id": "f", "prompt": "x" * CONTEXT, "answer": "too long"},
        {"id": "g", "question": "Last?", "answer": "yes"},
    ]
    lines = [json.dumps(r).encode() + b"\n" for r in rows]
    lines.insert(3, b'{"id": "bad", "answer": "caf\xe9"}\n')  # Latin-1 byte: not UTF-8
    inp.write_bytes(b"".join(lines))
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(
        app, ["score", "-i", str(inp), "-o", str(out), "--no-progress", "--logprobs"]
    )
    assert res.exit_code == 1, res.output  # some rows failed
    got = _read_jsonl(out)
    assert [r["id"] for r in got] == ["a", "b", "g"]
    a = got[0]
    assert a["nll"] == pytest.approx(_toy_nll("paris")) and a["num_tokens"] == 5
    assert a["ln_nll"] == pytest.approx(a["nll"] / 5)
    assert a["is_greedy"] is True and got[1]["is_greedy"] is False
    assert a["correct"] is True and a["input_line"] == 1
    assert a["tokens"] == list("paris") and len(a["token_logprobs"]) == 5
    errs = _read_jsonl(Path(str(out) + ".errors.jsonl"))
    by_line = {e["line"]: e["error"] for e in errs}
    assert set(by_line) == {3, 4, 5, 6, 7}
    assert "missing field 'answer'" in by_line[3]
    assert "UTF-8" in by_line[4]
    assert "'answer' is empty" in by_line[5]
    assert "one of 'question', 'prompt' or 'messages'" in by_line[6]
    assert "over the context" in by_line[7]
    assert "5 row(s) failed" in res.output and "Traceback" not in res.output


def test_question_prompt_is_rendered_like_ask(tmp_path):
    seen = []

    class Spy(ToyModel):
        def score(self, prompts, answers, **kw):
            seen.extend(prompts)
            return super().score(prompts, answers, **kw)

    inp = tmp_path / "in.jsonl"
    _write_jsonl(inp, [{"question": "Who?", "answer": "me"}, {"prompt": "Verbatim", "answer": "x"}])
    job = ScoreJob(
        str(inp),
        str(tmp_path / "o.jsonl"),
        "jsonl",
        "jsonl",
        None,
        progress=False,
    )
    run_score_job(Spy(), job)
    assert seen == [ask_prompt("Who?", long=False), "Verbatim"]


def test_csv_and_parquet_inputs_csv_output(tmp_path, toy):
    import pandas as pd

    df = pd.DataFrame(
        {
            "id": [1, 2, 3],
            "question": ["q1", "q2", "q3"],
            "answer": ["abc", "", "de"],
            "label": [1, 0, 1],
        }
    )
    df.to_csv(tmp_path / "in.csv", index=False)
    df.to_parquet(tmp_path / "in.parquet")
    for name in ("in.csv", "in.parquet"):
        out = tmp_path / f"{name}.out.csv"
        res = CliRunner().invoke(
            app, ["score", "-i", str(tmp_path / name), "-o", str(out), "--no-progress"]
        )
        assert res.exit_code == 1, res.output  # the empty answer
        got = pd.read_csv(out)
        assert list(got["id"]) == [1, 3]
        assert got["nll"].tolist() == pytest.approx([_toy_nll("abc"), _toy_nll("de")])
        errs = _read_jsonl(Path(str(out) + ".errors.jsonl"))
        # CSV: physical line 3 (header is line 1); Parquet: row 2.
        assert [e["line"] for e in errs] == [3 if name.endswith("csv") else 2]


def test_stdin_to_stdout_and_calibration_columns(tmp_path, toy):
    rng = np.random.default_rng(0)
    g = rng.exponential(1.0, 400)
    cal = Calibrator().fit(g, rng.uniform(size=400) < np.exp(-g))
    cal.meta = {"measure": "g-nll", "model": "toy"}
    cal.save(tmp_path / "cal.json")
    stdin = (
        json.dumps({"question": "q", "answer": "ab"})
        + "\n"
        + json.dumps({"question": "q", "answer": "abcdefghijklmnopqrstuvwxyz"})
        + "\n"
    )
    res = CliRunner().invoke(
        app,
        [
            "score",
            "-i",
            "-",
            "-o",
            "-",
            "--no-progress",
            "--calibration",
            str(tmp_path / "cal.json"),
            "--with-greedy",
        ],
        input=stdin,
    )
    assert res.exit_code == 0, res.output
    got = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert len(got) == 2
    assert got[0]["p_correct"] == pytest.approx(cal.predict_proba([got[0]["nll"]])[0])
    assert got[0]["p_correct"] > got[1]["p_correct"]
    assert got[1]["abstain"] == bool(cal.abstain([got[1]["nll"]])[0])
    assert got[0]["greedy_answer"] == "toy" and got[0]["g_nll"] == pytest.approx(0.75)


def _big_input(path: Path, n: int) -> None:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(
                json.dumps({"id": i, "question": f"q{i}", "answer": "abcdefgh"[: 1 + i % 8]}) + "\n"
            )


@pytest.mark.e2e
def test_resume_after_kill_writes_every_row_once(tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    n = 3000
    _big_input(inp, n)
    with inp.open("a") as fh:  # a bad row in the middle: reported once, not twice
        fh.write('{"id": "bad", "question": "q"}\n')
    _big_input(tmp_path / "more.jsonl", 500)
    with inp.open("a") as fh:
        fh.write((tmp_path / "more.jsonl").read_text())
    code = (
        f"import sys, gnll; sys.path.insert(0, {str(HERE)!r}); from fakes import ToyModel;"
        "gnll.load_model = lambda name, **kw: ToyModel(delay=0.02);"
        "from gnll.cli.main import app; app()"
    )
    args = [
        sys.executable,
        "-c",
        code,
        "score",
        "-i",
        str(inp),
        "-o",
        str(out),
        "--no-progress",
        "--chunk-size",
        "20",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and (not out.exists() or out.stat().st_size < 20_000):
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    partial = out.read_text().count("\n")
    assert 0 < partial < n, partial
    with out.open("a") as fh:
        fh.write('{"id": 99, "torn')  # what a kill mid-write leaves
    model = ToyModel()
    job = ScoreJob(
        str(inp),
        str(out),
        "jsonl",
        "jsonl",
        Path(str(out) + ".errors.jsonl"),
        resume=True,
        progress=False,
    )
    summary = run_score_job(model, job)
    assert summary.skipped_resume >= partial and summary.failed == 1
    got = _read_jsonl(out)
    assert [r["input_line"] for r in got] == [i for i in range(1, n + 502) if i != n + 1]
    assert all(r["nll"] == pytest.approx(_toy_nll(r["answer"])) for r in got)
    assert [e["line"] for e in _read_jsonl(Path(str(out) + ".errors.jsonl"))] == [n + 1]


def _peak_bytes(tmp_path: Path, n: int) -> int:
    inp, out = tmp_path / f"in{n}.jsonl", tmp_path / f"out{n}.jsonl"
    _big_input(inp, n)
    job = ScoreJob(str(inp), str(out), "jsonl", "jsonl", None, progress=False, chunk_size=256)
    tracemalloc.start()
    try:
        summary = run_score_job(ToyModel(), job)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert summary.scored == n
    return peak


def test_memory_does_not_grow_with_the_file(tmp_path):
    """Peak traced memory for 20,000 rows is within 1.5x of that for 2,000 (it would be ~10x if
    rows were kept); bench/score_memory.py measures the RSS on 1M rows."""
    small = _peak_bytes(tmp_path, 2_000)
    large = _peak_bytes(tmp_path, 20_000)
    assert large < 1.5 * small, (small, large)


def test_messages_raw_prompt_and_a_backend_that_cannot_score(tmp_path, monkeypatch):
    seen = []

    class Chat(ToyModel):
        capabilities = gnll.backends.base.Capabilities(beams=False, chat=True)

        def render_prompt(self, prompt):
            turns = gnll.backends.base.chat_messages(prompt)
            return "".join(f"<{m['role']}>{m['content']}" for m in turns) + "<assistant>"

        def score(self, prompts, answers, *, raw_prompt=False, **kw):
            seen.extend((p if raw_prompt else self.render_prompt(p), raw_prompt) for p in prompts)
            return super().score(prompts, answers, raw_prompt=raw_prompt, **kw)

    monkeypatch.setattr(gnll, "load_model", lambda name, **kw: Chat())
    inp = tmp_path / "in.jsonl"
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    _write_jsonl(
        inp,
        [
            {"messages": msgs, "answer": "hello"},
            {"prompt": "<user>exact</user>", "answer": "x"},
            {"messages": [{"content": "no role"}], "answer": "x"},
        ],
    )
    out = tmp_path / "o.jsonl"
    res = CliRunner().invoke(
        app, ["score", "-i", str(inp), "-o", str(out), "--no-progress", "--raw-prompt"]
    )
    assert res.exit_code == 1, res.output
    # messages go to the model as chat turns (its template renders them), a raw prompt as is
    assert seen == [("<system>Be brief.<user>Hi?<assistant>", False), ("<user>exact</user>", True)]
    assert (
        "'messages' must be a non-empty list"
        in _read_jsonl(Path(str(out) + ".errors.jsonl"))[0]["error"]
    )
    # Both rendered prompts end in ">": answers are scored as the model would write them, " hello", " x".
    assert [r["num_tokens"] for r in _read_jsonl(out)] == [6, 2]
    res = CliRunner().invoke(
        app,
        ["score", "-i", str(inp), "-o", str(out), "--no-progress", "--raw-prompt", "--verbatim"]
        + ["--overwrite"],
    )
    assert [r["num_tokens"] for r in _read_jsonl(out)] == [5, 1]

    class NoScoring(ToyModel):
        capabilities = gnll.backends.base.Capabilities(scoring=False)

    monkeypatch.setattr(gnll, "load_model", lambda name, **kw: NoScoring())
    args = ["score", "-i", str(inp), "-o", str(out), "--no-progress", "--overwrite"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "cannot score given answers" in res.output


def test_csv_output_keeps_columns_the_first_row_lacks(tmp_path, toy):
    rows = [
        {"id": "c1", "question": "Who wrote Hamlet?", "answer": "shakespeare"},
        {"id": "c2", "question": "Who wrote Hamlet?", "answer": "marlowe", "note": "extra"},
        {"id": "c3", "question": "Who?", "answer": "kyd", "late": 7},
    ]
    inp = tmp_path / "two.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "two.csv"
    # One row per chunk: "late" arrives after rows are on disk, so the header must widen.
    args = ["score", "-i", str(inp), "-o", str(out), "--no-progress", "--chunk_size", "1"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    import pandas as pd

    got = pd.read_csv(out)
    assert {"note", "late", "nll"} <= set(got.columns)
    assert got["note"].fillna("").tolist() == ["", "extra", ""]
    assert got["late"].fillna(0).tolist() == [0, 0, 7]
    assert got["nll"].tolist() == pytest.approx([_toy_nll(r["answer"]) for r in rows])


def test_no_errors_file_without_bad_rows_and_one_wording_of_bad_json(tmp_path, toy):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"question": "q", "answer": "abc"}) + "\n")
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(app, ["score", "-i", str(inp), "-o", str(out), "--no_progress"])
    assert res.exit_code == 0, res.output
    assert not Path(str(out) + ".errors.jsonl").exists()
    inp.write_text('{"question": "q", "answer": "a\tb\x01"}\n'.replace("\x01", "\\x01"))
    args = ["score", "-i", str(inp), "-o", str(out), "--no_progress", "--overwrite"]
    res = CliRunner().invoke(app, args)
    [err] = _read_jsonl(Path(str(out) + ".errors.jsonl"))
    assert err["error"].startswith("not valid JSON (") and " at at " not in err["error"]
