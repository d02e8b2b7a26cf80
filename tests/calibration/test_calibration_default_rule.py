"""Calibrations a user can use: a default rule that answers some questions, stated in the file, and a
`gnll serve --policy refuse` that will not start when it would refuse every answer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gnll.calibration import Calibrator, load_calibration
from gnll.cli.main import app
from gnll.serving import AbstentionPolicy


def _data(accuracy_at_best: float, n: int = 400, seed: int = 0):
    """G-NLL scores in [0, 10]; P(correct) falls from ``accuracy_at_best`` at 0 to 0 at 10."""
    rng = np.random.default_rng(seed)
    s = rng.uniform(0, 10, n)
    y = rng.uniform(0, 1, n) < accuracy_at_best * (1 - s / 10)
    return s, y


def test_unreachable_accuracy_target_defaults_to_the_coverage_rule(tmp_path):
    s, y = _data(0.3)  # a weak model: accuracy 0.8 among answered is out of reach
    cal = Calibrator().fit(s, y)
    assert cal.thresholds_["accuracy"].threshold == -np.inf
    assert cal.default_rule == "coverage"
    answered = ~cal.abstain(s)
    assert 0.7 < answered.mean() < 0.95  # about the 80% most certain answers
    d = cal.to_dict()
    assert d["default_rule"]["rule"] == "coverage"
    assert "out of reach" in d["default_rule"]["why"]
    back = Calibrator.load(cal.save(tmp_path / "c.json"))
    assert back.default_rule == "coverage"
    assert (back.abstain(s) == cal.abstain(s)).all()


def test_reachable_accuracy_target_stays_the_default():
    s, y = _data(1.0)
    cal = Calibrator(target_accuracy=0.8).fit(s, y)
    assert np.isfinite(cal.thresholds_["accuracy"].threshold)
    assert cal.default_rule == "accuracy"
    assert Calibrator(default_rule="coverage").fit(s, y).default_rule == "coverage"
    with pytest.raises(ValueError, match="default_rule must be one of"):
        Calibrator(default_rule="most")


@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "gemma-3-270m"])
def test_shipped_calibrations_answer_some_questions_by_default(model):
    cal = load_calibration("auto", model=model)
    rule = cal.default_rule
    t = cal.thresholds_[rule]
    assert 0 < t.threshold < np.inf, f"{model}: the default rule {rule!r} answers nothing"
    assert t.coverage > 0.5
    raw = json.loads(Path(cal.meta["path"]).read_text(encoding="utf-8"))
    assert raw["default_rule"]["rule"] == rule and raw["default_rule"]["why"]
    # fitted with the empty-answer rule: empty answers kept, not left out at "G-NLL 0"
    assert "empty_answers_left_out" not in raw["data"]
    assert "empty answers kept" in raw["data"]["empty_answers"]
    policy = AbstentionPolicy.from_calibration("auto", model=model, mode="refuse")
    assert policy.refuses_everything() is None
    assert policy.decide(0.5)[1] is False  # a confident answer is answered


def _unreachable_file(tmp_path):
    s, y = _data(0.3)
    return Calibrator(target_coverage=None).fit(s, y).save(tmp_path / "weak.json")


def test_serve_refuses_to_start_when_refuse_would_refuse_everything(tmp_path):
    path = _unreachable_file(tmp_path)  # only an accuracy rule, out of reach: refuses all
    runner = CliRunner()
    for args in (
        ["--calibration", str(path)],
        ["--calibration", str(path), "--min_p_correct", "0.99"],
        ["--threshold", "-1"],
    ):
        res = runner.invoke(app, ["serve", "--model", "no-such-model", "--policy", "refuse", *args])
        assert res.exit_code == 2, res.output
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and "would refuse every answer" in lines[0], res.output
    # annotate/flag with the same file start (they refuse nothing); checked on the policy itself
    assert AbstentionPolicy.from_calibration(path, mode="flag").mode == "flag"
    assert AbstentionPolicy(mode="refuse", threshold=3.0).refuses_everything() is None
