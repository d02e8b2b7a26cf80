"""``ScoreJob`` checks itself, and ``gnll score`` builds one job that either engine receives."""

from __future__ import annotations

import dataclasses
import json

import pytest
from fakes import ToyModel
from typer.testing import CliRunner

from gnll._util.validation import ParameterError
from gnll.calibration import Calibrator
from gnll.cli.main import app
from gnll.scoring import ScoreJob, ScoreSummary, build_score_job

BASE = dict(input="in.jsonl", output="out.jsonl", input_format="jsonl", output_format="jsonl")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("chunk_size", 0, "chunk_size must be >= 1, got 0"),
        ("batch_size", 0, "batch_size must be >= 1, got 0"),
        ("spans", "words", "spans must be sentence or json, got 'words'"),
        ("max_new_tokens", 0, "max_new_tokens must be >= 1, got 0"),
        ("output_format", "parquet", "output_format must be jsonl or csv"),
    ],
)
def test_score_job_refuses_what_the_cli_refuses(field, value, message):
    with pytest.raises(ParameterError, match=message) as exc:
        ScoreJob(**{**BASE, field: value}, errors=None)
    assert exc.value.param == field and isinstance(exc.value, ValueError)


def test_resume_needs_an_output_file():
    with pytest.raises(ParameterError, match="resume needs an output file"):
        ScoreJob(**{**BASE, "output": "-"}, errors=None, resume=True)


def test_one_token_cap_default_follows_long():
    assert ScoreJob(**BASE, errors=None).max_new_tokens == 50
    assert ScoreJob(**BASE, errors=None, long=True).max_new_tokens == 100
    assert ScoreJob(**BASE, errors=None, long=True, max_new_tokens=7).max_new_tokens == 7


def _calibration(tmp_path, measure: str) -> str:
    cal = Calibrator(method="platt").fit([0.1, 0.5, 1.0, 2.0, 3.0, 4.0], [1, 1, 1, 0, 0, 0])
    cal.meta.update(measure=measure, model="toy")
    path = tmp_path / f"{measure}.json"
    cal.save(path)
    return str(path)


def test_build_score_job_loads_and_checks_the_calibration(tmp_path):
    job = build_score_job(
        model="toy", calibration=_calibration(tmp_path, "g-nll"), **BASE, errors=None
    )
    assert job.calibrator.meta["measure"] == "g-nll"
    with pytest.raises(ValueError, match="maps measure 'pe'; gnll score can apply"):
        build_score_job(model="toy", calibration=_calibration(tmp_path, "pe"), **BASE, errors=None)


def test_both_engines_receive_the_same_job(tmp_path, monkeypatch):
    """The job the Ray scorer gets equals the local one, field for field (``--spans`` included)."""
    import gnll.distributed.scoring as ray_scoring
    import gnll.scoring as scoring

    seen: dict[str, ScoreJob] = {}

    def local(model, job, **kw):
        seen["local"] = job
        return ScoreSummary()

    def on_ray(job, model, model_args, cluster):
        seen["ray"] = job
        return ScoreSummary()

    monkeypatch.setattr(scoring, "run_score_job", local)
    monkeypatch.setattr(ray_scoring, "run_score_job", on_ray)
    monkeypatch.setattr("gnll.load_model", lambda *a, **k: ToyModel())
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"question": "q?", "answer": "a"}) + "\n")
    args = ["score", "-i", str(src), "-o", str(tmp_path / "out.jsonl"), "--no-progress"]
    args += ["--spans", "sentence", "--with-greedy", "--long", "--logprobs", "--chunk-size", "3"]
    for engine in ("local", "ray"):
        res = CliRunner().invoke(app, [*args, "--engine", engine, "--address", "local"])
        assert res.exit_code == 0, res.output
    assert dataclasses.asdict(seen["ray"]) == dataclasses.asdict(seen["local"])
    assert seen["ray"].spans == "sentence" and seen["ray"].max_new_tokens == 100
