"""gnll.calibration and `gnll calibrate`: recovery of known calibration curves, guarantees by simulation,
the file format and the command end to end (all synthetic: no model needed)."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from scipy.special import expit
from typer.testing import CliRunner

from gnll.calibration import (
    CalibrationMismatchWarning,
    Calibrator,
    accuracy_threshold,
    coverage_threshold,
)
from gnll.calibration.metrics import calibration_bins, expected_calibration_error
from gnll.cli.main import app


def _logistic_data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    g = rng.exponential(1.5, n)
    y = rng.uniform(size=n) < expit(2.0 - 1.5 * g)
    return g, y


def _step(g):
    return np.where(g < 1.0, 0.9, np.where(g < 2.0, 0.5, 0.1))


def test_platt_recovers_a_logistic_curve_within_0_05():
    g, y = _logistic_data(5000, 0)
    cal = Calibrator().fit(g, y)
    grid = np.linspace(0, 4, 41)
    err = np.abs(cal.predict_proba(grid) - expit(2.0 - 1.5 * grid))
    assert cal.method_ == "platt"
    assert err.max() < 0.05, err.max()
    # The held-out ECE of a well-specified model is small (10 equal-width bins).
    assert cal.heldout_metrics["ece"] < 0.03


def test_isotonic_recovers_a_step_curve_platt_cannot_fit():
    rng = np.random.default_rng(1)
    g = rng.uniform(0, 3, 6000)
    y = rng.uniform(size=6000) < _step(g)
    cal = Calibrator().fit(g, y)
    assert cal.method_ == "isotonic"
    assert cal.cv_["isotonic"]["log_loss"] < cal.cv_["platt"]["log_loss"]
    # Away from the jumps (+-0.2) the fitted curve is within 0.06 of the truth.
    grid = np.array([0.1, 0.5, 0.8, 1.2, 1.5, 1.8, 2.2, 2.5, 2.9])
    err = np.abs(cal.predict_proba(grid) - _step(grid))
    assert err.max() < 0.06, err
    # Monotone: more uncertain never means more likely correct.
    fine = cal.predict_proba(np.linspace(-1, 5, 200))
    assert np.all(np.diff(fine) <= 1e-12)
    assert fine.min() > 0 and fine.max() < 1


def test_ece_and_bins_on_a_hand_checked_case():
    p = np.array([0.05, 0.15, 0.15, 0.95])
    y = np.array([0, 0, 1, 1])
    bins = calibration_bins(p, y, bins=10)
    assert [b["count"] for b in bins] == [1, 2, 1]
    # |0.05-0| * 1 + |0.15-0.5| * 2 + |0.95-1| * 1, over 4
    assert expected_calibration_error(p, y) == pytest.approx((0.05 + 0.7 + 0.05) / 4)


def test_accuracy_threshold_guarantee_holds_by_simulation():
    """P(correct | s) = 1 - s, s ~ U(0, 1): accuracy among answered at t is 1 - t/2, so t <= 0.4 is
    needed for 80%. Over 400 calibration sets of 500 rows, the chosen threshold may exceed 0.4 in at
    most delta = 10% of them (plus 3 Monte-Carlo standard errors), and it must not be useless."""
    rng = np.random.default_rng(2)
    reps, n, delta = 400, 500, 0.1
    chosen = []
    for _ in range(reps):
        s = rng.uniform(size=n)
        y = rng.uniform(size=n) < 1 - s
        chosen.append(accuracy_threshold(s, y, target=0.8, delta=delta).threshold)
    chosen = np.array(chosen)
    violations = np.mean(chosen > 0.4)
    assert violations <= delta + 3 * math.sqrt(delta * (1 - delta) / reps), violations
    # Power: on average it answers at least 25% (the oracle answers 40%).
    assert np.mean(np.clip(chosen, 0, 1)) > 0.25


def test_coverage_threshold_guarantee_holds_by_simulation():
    """Scores ~ U(0, 1), so the true coverage of threshold t is t; it must be >= 0.8 in >= 90% of
    the draws, and not far above it (k-th order statistic is tight)."""
    rng = np.random.default_rng(3)
    reps, n, delta = 1000, 300, 0.1
    t = np.array(
        [
            coverage_threshold(rng.uniform(size=n), np.ones(n), target=0.8, delta=delta).threshold
            for _ in range(reps)
        ]
    )
    miss = np.mean(t < 0.8)
    assert miss <= delta + 3 * math.sqrt(delta * (1 - delta) / reps), miss
    assert miss >= delta - 3 * math.sqrt(delta * (1 - delta) / reps)  # not needlessly conservative
    assert np.median(t) < 0.85


def test_impossible_accuracy_target_abstains_on_everything():
    rng = np.random.default_rng(4)
    s = rng.uniform(size=300)
    y = rng.uniform(size=300) < 0.05
    t = accuracy_threshold(s, y, target=0.8)
    assert t.threshold == -math.inf and t.coverage == 0.0 and t.n_answered == 0
    assert not t.answers(s).any()


def test_save_load_round_trip_and_mismatch_warning(tmp_path):
    g, y = _logistic_data(1500, 5)
    cal = Calibrator(method="isotonic").fit(g, y)
    cal.meta = {"model": "m1", "prompt_fingerprint": "sha256:aaa", "measure": "g-nll"}
    path = cal.save(tmp_path / "c.json")
    d = json.loads(path.read_text())  # strict JSON: no NaN/Infinity tokens
    assert d["method"] == "isotonic" and d["model"] == "m1"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = Calibrator.load(path, model="m1", prompt_fingerprint="sha256:aaa")
    grid = np.linspace(0, 6, 50)
    np.testing.assert_allclose(same.predict_proba(grid), cal.predict_proba(grid), atol=1e-12)  # same path: the same map, saved and loaded
    np.testing.assert_array_equal(same.abstain(grid), cal.abstain(grid))
    with pytest.warns(CalibrationMismatchWarning, match="model 'm1', used with 'm2'"):
        Calibrator.load(path, model="m2")
    with pytest.warns(CalibrationMismatchWarning, match="another prompt template") as caught:
        Calibrator.load(path, prompt_fingerprint="sha256:bbb", prompt_description="my prompts")
    message = str(caught[0].message)
    assert "answers to my prompts" in message and "sha256" not in message  # words, not hashes


def test_nan_scores_never_become_numbers():
    g, y = _logistic_data(500, 6)
    cal = Calibrator().fit(g, y)
    p = cal.predict_proba([0.5, float("nan")])
    assert np.isfinite(p[0]) and np.isnan(p[1])
    assert cal.abstain([float("nan")])[0]


def test_bad_input_messages():
    with pytest.raises(ValueError, match="at least 2 correct and 2 incorrect"):
        Calibrator().fit([0.1, 0.2, 0.3], [1, 1, 1])
    with pytest.raises(ValueError, match="NaN or inf"):
        Calibrator().fit([0.1, float("nan"), 0.3, 0.4], [1, 0, 1, 0])
    with pytest.raises(ValueError, match="0/1"):
        Calibrator().fit([0.1, 0.2, 0.3, 0.4], [1, 0, 2, 0])


def _fake_run(path, n=600, seed=0, model="fake-model"):
    rng = np.random.default_rng(seed)
    (path / "tasks" / "t1").mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"config": {"model": model}}))
    (path / "tasks" / "t1" / "fingerprint.json").write_text(json.dumps({"prompt_prefix": "Hi.\n"}))
    with open(path / "samples.jsonl", "w") as fh:
        for i in range(n):
            g = float(rng.exponential(1.5))
            c = bool(rng.uniform() < expit(2 - 1.5 * g))
            m = {"g-nll": g if i else float("nan")}  # one row without a score is dropped, not fatal
            fh.write(
                json.dumps({"task": "t1", "measures": m, "correctness": {"f1": {"correct": c}}})
                + "\n"
            )


def test_cli_calibrate_on_an_eval_run(tmp_path):
    run = tmp_path / "run"
    _fake_run(run)
    out = tmp_path / "cal.json"
    res = CliRunner().invoke(app, ["calibrate", str(run), "--output", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert d["model"] == "fake-model" and d["data"]["n"] == 599 and d["data"]["dropped"] == 1
    assert d["prompt_fingerprint"].startswith("sha256:")
    assert set(d["thresholds"]) == {"accuracy", "coverage"}
    assert d["heldout"]["ece_binning"] == "10 equal-width bins on [0, 1]"
    assert (tmp_path / "cal.reliability.png").stat().st_size > 10_000
    cal = Calibrator.load(out)
    assert cal.predict_proba([0.0])[0] > cal.predict_proba([3.0])[0]


def test_cli_calibrate_on_a_scored_csv_and_errors(tmp_path):
    g, y = _logistic_data(400, 7)
    csv = tmp_path / "scored.csv"
    csv.write_text("nll,label\n" + "".join(f"{a},{int(b)}\n" for a, b in zip(g, y, strict=True)))
    out = tmp_path / "c.json"
    res = CliRunner().invoke(app, ["calibrate", str(csv), "-o", str(out), "--measure", "nll"])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["data"]["sources"][0]["label_column"] == "label"
    res = CliRunner().invoke(app, ["calibrate", str(csv), "-o", str(out)])  # no g-nll column
    assert res.exit_code == 2 and "no column 'g-nll'" in res.output
    assert "Traceback" not in res.output


def test_maps_never_increase_with_uncertainty_even_when_the_data_do():
    rng = np.random.default_rng(8)
    g = rng.uniform(0, 3, 2000)
    y = rng.uniform(size=2000) < 0.1 + 0.2 * g / 3  # more uncertain, more often right
    for method in ("platt", "isotonic"):
        p = Calibrator(method=method).fit(g, y).predict_proba(np.linspace(0, 3, 50))
        assert np.all(np.diff(p) <= 1e-12), method
    platt = Calibrator(method="platt").fit(g, y)
    assert platt.map_["coef"] == 0.0
    assert platt.predict_proba([1.0])[0] == pytest.approx(y.mean())
