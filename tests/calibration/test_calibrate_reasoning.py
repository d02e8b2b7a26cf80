"""`gnll calibrate` records which tokens its G-NLL covers (a reasoning model's answer after the
marker, or whole outputs), and applying it to answers split otherwise is refused."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from fakes import ToyModel

from gnll.backends.reasoning_model import ReasoningModel
from gnll.calibration import CalibrationFormatError, calibrate_files
from gnll.policy import AbstentionPolicy
from gnll.scoring.stream import ScoreJob


def scored_file(path, reasoning: bool):
    rng = np.random.default_rng(0)
    g = rng.exponential(1.5, 400)
    df = pd.DataFrame({"g_nll": g, "correct": rng.uniform(size=400) < np.exp(-g)})
    if reasoning:
        df["scored"] = "answer"
    df.to_csv(path, index=False)
    return path


def test_the_file_records_the_split_and_refuses_other_splits(tmp_path):
    cal, _ = calibrate_files([scored_file(tmp_path / "r.csv", True)], target_coverage=None)
    assert cal.meta["scored"] == "answer"
    with pytest.raises(CalibrationFormatError, match="reasoning model's answers"):
        cal.check(scored="output")
    cal.check(scored="answer")  # the same split: fine
    # serving: no P(correct) for whole outputs from a reasoning calibration
    policy = AbstentionPolicy(calibrator=cal, mode="flag")
    assert policy.decide(1.0, None, "output") == (None, None)
    assert policy.decide(1.0, None, "answer")[0] is not None
    # gnll score: refused before any row, for a model that does not reason
    job = ScoreJob("in.jsonl", "out.jsonl", "jsonl", "jsonl", None, calibrator=cal)
    with pytest.raises(ValueError, match="fit a calibration on answers split the same way"):
        job.for_model(ToyModel())
    job.for_model(ReasoningModel(ToyModel()))


def test_a_whole_output_calibration_is_refused_for_a_reasoning_model(tmp_path):
    cal, _ = calibrate_files([scored_file(tmp_path / "o.csv", False)], target_coverage=None)
    assert cal.meta["scored"] == "output"
    job = ScoreJob("in.jsonl", "out.jsonl", "jsonl", "jsonl", None, calibrator=cal)
    with pytest.raises(ValueError, match="whole outputs"):
        job.for_model(ReasoningModel(ToyModel()))
    del cal.meta["scored"]  # a file written before the split was recorded: whole outputs
    with pytest.raises(ValueError, match="whole outputs"):
        job.for_model(ReasoningModel(ToyModel()))


def test_mixed_data_is_refused(tmp_path):
    with pytest.raises(ValueError, match="mixes a reasoning model's answers"):
        calibrate_files(
            [scored_file(tmp_path / "r.csv", True), scored_file(tmp_path / "o.csv", False)]
        )
