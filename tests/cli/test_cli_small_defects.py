"""Small things a new user hit: an unknown task suggests the near names and lists the groups; a
clean usage error is one line without "(--debug shows the traceback)"; `gnll eval --resume` with
other --tasks says what it adds and what it leaves out."""

from __future__ import annotations

import logging

import pytest
from fakes import FakeModel, cfg, make_data_dir
from typer.testing import CliRunner

from gnll.cli.main import app
from gnll.evaluation.run.runner import Evaluator

runner = CliRunner()


@pytest.mark.parametrize(
    "asked,near",
    [
        ("svamp", "svamp_long or svamp_short?"),
        ("nq_open", "nq_open_long or nq_open_short?"),
        ("trivia_short", "triviaqa_short"),
    ],
)
def test_unknown_task_says_did_you_mean_and_lists_the_groups(asked, near):
    res = runner.invoke(app, ["eval", "--tasks", asked, "--limit", "2"], env={"COLUMNS": "400"})
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert f"did you mean {near}" in text
    assert "groups: all, short, long" in text


def test_a_usage_error_is_one_line_without_the_debug_hint(tmp_path):
    res = runner.invoke(
        app, ["score", "-i", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o.jsonl")]
    )
    assert res.exit_code == 2 and "does not exist" in res.stderr
    res = runner.invoke(app, ["ask", "What?", "--model", "smollm3-135m"])
    assert res.exit_code == 2, res.output
    assert "not an embedded model" in res.stderr
    assert "--debug shows the traceback" not in res.stderr


def test_a_failure_keeps_the_debug_hint(monkeypatch):
    import gnll

    def boom(name, **kw):
        raise RuntimeError("something inside broke")

    monkeypatch.setattr(gnll, "load_model", boom)
    res = runner.invoke(app, ["ask", "What?"])
    assert res.exit_code == 1 and "(--debug shows the traceback)" in res.stderr


def test_eval_resume_with_other_tasks_says_what_it_adds_and_leaves_out(tmp_path, caplog):
    data_dir = make_data_dir(tmp_path / "data")
    run = tmp_path / "run"
    small = dict(limit=8, beams=1, samples=2, measures=["g-nll"], chunk_size=8)
    Evaluator(cfg(data_dir, run, tasks=["svamp_short"], **small), model=FakeModel()).run()
    with caplog.at_level(logging.WARNING, logger="gnll"):
        Evaluator(
            cfg(data_dir, run, tasks=["nq_open_short"], resume=True, **small), model=FakeModel()
        ).run()
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "adding nq_open_short" in said and "leaving out svamp_short" in said
    assert "--tasks svamp_short,nq_open_short" in said
    assert (run / "tasks" / "svamp_short").is_dir()  # its work is kept
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gnll"):
        Evaluator(
            cfg(data_dir, run, tasks=["svamp_short", "nq_open_short"], resume=True, **small),
            model=FakeModel(),
        ).run()
    assert "leaving out" not in " ".join(r.getMessage() for r in caplog.records)
