"""One prompt format, kept: `gnll generate` writes which model answered under which prompt format
(and takes --prompt_format, as `gnll ask` does), so a calibration fitted on its labelled output
records both; `gnll ask`'s template warning names prompts in words, not hashes."""

from __future__ import annotations

import json
import re

import pytest
from fakes import FakeModel, cfg, make_data_dir
from typer.testing import CliRunner

import gnll
from gnll.cli.main import app
from gnll.evaluation.run.runner import Evaluator

runner = CliRunner()


@pytest.fixture
def fake(monkeypatch):
    model = FakeModel("fake-lm")
    monkeypatch.setattr(gnll, "load_model", lambda *a, **k: model)
    return model


@pytest.mark.parametrize("fmt", ["chat", "instruction"])
def test_generate_label_calibrate_records_the_prompt_format_and_model(tmp_path, fake, fmt):
    questions = tmp_path / "q.jsonl"
    questions.write_text(
        "".join(
            json.dumps({"id": k, "question": f"What is {k} plus one?"}) + "\n" for k in range(60)
        )
    )
    out = tmp_path / "answers.jsonl"
    res = runner.invoke(
        app, ["generate", "-i", str(questions), "-o", str(out), "--prompt_format", fmt]
    )
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert {(r["prompt_format"], r["model"]) for r in rows} == {(fmt, "fake-lm")}
    # the user labels the answers (here: right when the answer is k + 1)
    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text(
        "".join(
            json.dumps({**r, "correct": r["answer"].lstrip("n") == str(r["id"] + 1)}) + "\n"
            for r in rows
        )
    )
    res = runner.invoke(app, ["calibrate", str(labelled), "-o", str(tmp_path / "cal.json")])
    assert res.exit_code == 0, res.output
    assert "does not say which prompt format" not in res.output
    meta = json.loads((tmp_path / "cal.json").read_text())
    assert (meta["prompt_format"], meta["model"]) == (fmt, "fake-lm")
    # and the calibration is then checked against the format it is used with
    other = "instruction" if fmt == "chat" else "chat"
    res = runner.invoke(
        app,
        ["ask", "What is 3 plus one?", "--calibration", str(tmp_path / "cal.json")]
        + ["--prompt_format", other],
    )
    assert res.exit_code != 0 and f"'{fmt}' prompts" in res.output


def test_ask_warns_about_another_template_in_words(tmp_path, fake):
    data = make_data_dir(tmp_path / "data")
    run = tmp_path / "run"
    opts = dict(tasks=["triviaqa_short"], measures=["g-nll"], limit=40)
    Evaluator(cfg(data, run, **opts), model=FakeModel("fake-lm")).run()
    res = runner.invoke(app, ["calibrate", str(run), "-o", str(tmp_path / "cal.json")])
    assert res.exit_code == 0, res.output
    res = runner.invoke(
        app, ["ask", "What is 3 plus one?", "--calibration", str(tmp_path / "cal.json")]
    )
    assert res.exit_code == 0, res.output
    [warning] = [x for x in res.stderr.splitlines() if x.startswith("warning:")]
    assert re.search(
        r"fitted on answers to gnll eval's \d+-shot triviaqa_short prompts, but is used on answers "
        r"to questions asked as gnll ask asks them \(zero-shot",
        warning,
    ), warning
    assert "sha256" not in warning and "prompt format" not in warning
