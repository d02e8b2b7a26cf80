"""Messages that name the right thing: Ctrl-C says what each command keeps, a bad --port is a usage
error, one "what to do" at most, an over-long question is named as a question, generate's bar says
generating, the default-rule text matches the thresholds table, a CSV without a needed column is
one error, not one per row."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fakes import ToyModel
from typer.testing import CliRunner

import gnll
from gnll.backends.openai.client import ServerFailing
from gnll.backends.resolve import HubUnreachable
from gnll.calibration import Calibrator
from gnll.cli.main import app
from tests.scoring.test_api_ask import ScriptedModel

runner = CliRunner()


def _questions(path: Path, n: int = 3) -> Path:
    path.write_text("".join(json.dumps({"id": i, "question": f"q{i}?"}) + "\n" for i in range(n)))
    return path


class Interrupted(ToyModel):
    def score(self, *a, **k):
        raise KeyboardInterrupt


def test_ctrl_c_says_resume_only_for_commands_that_resume(tmp_path, monkeypatch):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    monkeypatch.setattr(gnll, "load_model", lambda *a, **k: Interrupted())
    res = runner.invoke(app, ["score", "-i", str(inp), "-o", str(tmp_path / "o.jsonl")])
    assert res.exit_code == 130
    assert "rerun the same command with --resume" in res.stderr and "eval" not in res.stderr

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(gnll, "load_model", interrupt)
    res = runner.invoke(app, ["ask", "What is the capital of France?"])
    assert res.exit_code == 130 and res.stderr.strip().endswith("interrupted")
    assert "resume" not in res.stderr


def test_a_port_out_of_range_is_a_usage_error():
    res = runner.invoke(app, ["serve", "--port", "70000"])
    assert res.exit_code == 2
    assert "--port" in res.output and "bug" not in res.output


def _server_failing() -> ServerFailing:
    """The error the openai backend raises when a server keeps failing, with its own text."""
    from gnll.backends.openai.client import HTTPClient

    client = HTTPClient("http://127.0.0.1:9/v1")
    for _ in range(client.streak.threshold):
        client.streak.record("connection", "cannot connect")
    return ServerFailing(client._failing_message())


@pytest.mark.parametrize(
    ("exc", "forbidden"),
    [
        (_server_failing, "resume"),  # gnll ask has no --resume
        (lambda: HubUnreachable("'org/m' ... no network; set HF_HUB_OFFLINE=1 ..."), "server"),
    ],
)
def test_at_most_one_what_to_do_and_it_fits_the_command(monkeypatch, exc, forbidden):
    def load(*a, **k):
        raise exc()

    monkeypatch.setattr(gnll, "load_model", load)
    res = runner.invoke(app, ["ask", "Q?"])
    assert res.exit_code == 1
    assert res.output.count("what to do") <= 1 and forbidden not in res.output.split("error:")[1]


def test_a_network_failure_of_a_resumable_command_says_resume(tmp_path, monkeypatch):
    monkeypatch.setattr(gnll, "load_model", lambda *a, **k: (_ for _ in ()).throw(TimeoutError()))
    inp = _questions(tmp_path / "q.jsonl")
    res = runner.invoke(app, ["generate", "-i", str(inp), "-o", str(tmp_path / "a.jsonl")])
    assert res.exit_code == 1 and "then rerun with --resume" in res.output


class TooLong(ScriptedModel):
    def generate(self, prompts, config=None, **kw):
        from gnll.backends.base import ContextOverflow

        raise ContextOverflow("tiny", 0, 20045, config.max_new_tokens, 8192)


def test_an_over_long_question_is_named_as_a_question(tmp_path, monkeypatch):
    monkeypatch.setattr(gnll, "load_model", lambda *a, **k: TooLong())
    inp = _questions(tmp_path / "q.jsonl", 1)
    out = tmp_path / "a.jsonl"
    res = runner.invoke(app, ["generate", "-i", str(inp), "-o", str(out)])
    assert res.exit_code == 1
    [err] = [json.loads(x) for x in Path(str(out) + ".errors.jsonl").read_text().splitlines()]
    assert err["line"] == 1 and err["id"] == 0
    assert "the question is too long" in err["error"] and "--max_new_tokens" in err["error"]
    assert "prompt 0" not in err["error"] and "few-shot" not in err["error"]
    res = runner.invoke(app, ["ask", "a very long question?"])
    assert res.exit_code == 2
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the question is too long: its prompt has 20045")
    assert "shorten the question or lower --max_new_tokens" in res.stderr


def test_generate_progress_bar_says_generating(tmp_path, monkeypatch):
    monkeypatch.setattr(gnll, "load_model", lambda *a, **k: ScriptedModel())
    inp = _questions(tmp_path / "q.jsonl")
    res = runner.invoke(app, ["generate", "-i", str(inp), "-o", str(tmp_path / "a.jsonl")])
    assert res.exit_code == 0, res.output
    assert "generating:" in res.stderr and "scoring:" not in res.stderr


def test_default_rule_text_agrees_with_the_thresholds_it_chose():
    rng = np.random.default_rng(0)
    s = rng.uniform(0, 5, 10)
    y = np.arange(10) < 5  # ten rows: accuracy 0.8 is out of reach, coverage 0.8 answers all
    cal = Calibrator().fit(s, y)
    why = cal.to_dict()["default_rule"]["why"]
    assert cal.thresholds_["coverage"].threshold == np.inf
    assert "answers every question (1.000 answered)" in why
    assert "most certain fraction" not in why


@pytest.mark.parametrize(("command", "column"), [("score", "'answer'"), ("generate", "'question'")])
def test_a_csv_without_a_needed_column_is_one_error_not_one_per_row(
    tmp_path, monkeypatch, command, column
):
    monkeypatch.setattr(
        gnll, "load_model", lambda *a, **k: ToyModel() if command == "score" else ScriptedModel()
    )
    inp = tmp_path / "rows.csv"
    header = "id,prompt" if command == "score" else "id,prompt,answer"
    cells = ",x" if command == "generate" else ""
    inp.write_text(header + "\n" + "".join(f"{i},p{i}{cells}\n" for i in range(50)))
    out = tmp_path / "o.jsonl"
    res = runner.invoke(app, [command, "-i", str(inp), "-o", str(out), "--no_progress"])
    assert res.exit_code == 2, res.output
    assert f"has no {column} column (its columns: {header.replace(',', ', ')})" in res.output
    assert not Path(str(out) + ".errors.jsonl").exists()
