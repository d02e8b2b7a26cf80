"""Runs and inputs: a mistyped model leaves no run directory, the advice never suggests what is
refused, an empty question is refused, and damaged run files are errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import FakeModel, cfg, make_data_dir
from typer.testing import CliRunner

import gnll
from gnll.cli.main import app
from gnll.evaluation.run.runner import Evaluator, FingerprintMismatchError

runner = CliRunner()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return make_data_dir(tmp_path_factory.mktemp("data"))


def test_a_mistyped_model_leaves_no_run_directory(data_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(gnll, "load_model", lambda *a, **k: pytest.fail("nothing may load"))
    out = tmp_path / "runs" / "x"
    args = ["eval", "--model", "smollm3", "--tasks", "triviaqa_short", "--limit", "2"]
    res = runner.invoke(app, [*args, "--data_dir", str(data_dir), "--output_path", str(out)])
    assert res.exit_code == 2, res.output
    assert "'smollm3' is not an embedded model" in res.output
    assert not out.exists()  # so the corrected command starts cleanly, without --overwrite


def test_a_mismatched_resume_advises_overwrite_not_what_is_refused(data_dir, tmp_path):
    opts = dict(tasks=["triviaqa_short"], measures=["g-nll"], limit=4)
    out = tmp_path / "run"
    Evaluator(cfg(data_dir, out, **opts), model=FakeModel()).run()
    other = cfg(data_dir, out, resume=True, **{**opts, "model": "other-lm"})
    with pytest.raises(FingerprintMismatchError) as err:
        Evaluator(other, model=FakeModel("other-lm")).run()
    text = str(err.value)
    assert "--overwrite instead of --resume" in text and "without --resume" not in text


def test_an_empty_fingerprint_file_is_an_error_that_names_it(data_dir, tmp_path):
    opts = dict(tasks=["triviaqa_short"], measures=["g-nll"], limit=4)
    out = tmp_path / "run"
    Evaluator(cfg(data_dir, out, **opts), model=FakeModel()).run()
    fp = out / "tasks" / "triviaqa_short" / "fingerprint.json"
    fp.write_text("")
    with pytest.raises(ValueError, match=f"{fp} is empty"):
        Evaluator(cfg(data_dir, out, resume=True, **opts), model=FakeModel()).run()


def test_a_truncated_results_file_is_an_error_that_names_it(data_dir, tmp_path):
    out = tmp_path / "run"
    opts = dict(tasks=["triviaqa_short"], measures=["g-nll"], limit=4)
    Evaluator(cfg(data_dir, out, **opts), model=FakeModel()).run()
    results = out / "results.json"
    results.write_text(results.read_text()[:200])
    res = runner.invoke(app, ["table", str(out)])
    assert res.exit_code == 2, res.output
    assert f"{results} is not valid JSON (" in res.output and "cut short" in res.output
    assert len([x for x in res.output.splitlines() if x.startswith("error:")]) == 1


@pytest.mark.parametrize("question", ["", "   ", "\n\t"])
def test_ask_refuses_an_empty_question_in_one_line_before_loading(question, monkeypatch):
    monkeypatch.setattr(gnll, "load_model", lambda *a, **k: pytest.fail("nothing may load"))
    res = runner.invoke(app, ["ask", question, "--json"])
    assert res.exit_code == 2
    assert res.stderr.strip() == (
        'error: the question is empty: ask something, e.g. gnll ask "What is the capital of '
        'France?"'
    )
    with pytest.raises(ValueError, match="the question is empty"):
        gnll.ask(FakeModel(), question)
    assert json.dumps(question)  # the library refuses it too, whatever the surface
