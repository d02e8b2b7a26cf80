"""Scoring and calibration on the real embedded model: `gnll ask --calibration`, `gnll score` round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from gnll.calibration import Calibrator, load_calibration, prompt_fingerprint, shipped_calibration
from gnll.cli.main import app
from gnll.evaluation.data.prompts import ask_prompt

pytestmark = pytest.mark.model
runner = CliRunner()
MODEL = "smollm2-135m-instruct"


def _calibration(path, model=MODEL):
    rng = np.random.default_rng(0)
    g = rng.exponential(1.0, 500)
    cal = Calibrator().fit(g, rng.uniform(size=500) < np.exp(-g))
    cal.meta = {
        "measure": "g-nll",
        "model": model,
        "prompt_fingerprint": prompt_fingerprint(ask_prompt("{question}", long=False)),
    }
    cal.save(path)
    return cal


def test_ask_shows_p_correct_and_warns_on_another_model(tmp_path, smollm):
    cal = _calibration(tmp_path / "cal.json")
    args = [
        "ask",
        "What is the capital of France?",
        "--json",
        "--calibration",
        str(tmp_path / "cal.json"),
    ]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    record = json.loads(res.stdout.strip().splitlines()[-1])
    assert record["p_correct"] == pytest.approx(cal.predict_proba([record["g_nll"]])[0])
    assert record["abstain"] == bool(cal.abstain([record["g_nll"]])[0])
    assert "warning" not in res.stderr
    _calibration(tmp_path / "other.json", model="gemma-3-270m")
    res = runner.invoke(app, [*args[:-1], str(tmp_path / "other.json")])
    assert res.exit_code == 0
    assert "fitted on model 'gemma-3-270m'" in res.stderr


def test_shipped_calibrations_load_for_both_embedded_models():
    for name in (MODEL, "gemma-3-270m"):
        path = shipped_calibration(name)
        assert path is not None, f"no shipped calibration for {name}"
        cal = load_calibration(
            "auto",
            model=name,
            prompt_fingerprint=prompt_fingerprint(ask_prompt("{question}", long=False)),
        )
        assert cal.meta["model"] == name and cal.meta["data"]["n"] >= 100
        assert 0 <= cal.heldout_metrics["ece"] <= 1
        p = cal.predict_proba([0.1, 1.0, 5.0])
        assert p[0] >= p[1] >= p[2]
