"""The two-model cascade: threshold with a finite-sample guarantee, curve, and `gnll calibrate --cascade`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from gnll.calibration import cascade as C
from gnll.cli.main import app


def population(n=20000, seed=0):
    """P(small right | s) = 1 - s; the large model is right 85% of the time, independently."""
    rng = np.random.default_rng(seed)
    s = rng.uniform(0, 1, n)
    return s, rng.uniform(size=n) < 1 - s, rng.uniform(size=n) < 0.85


def test_guarantee_holds_in_simulation():
    s, a, b = population()
    delta = 0.1
    out = C.guarantee_violation_rate(s, a, b, target=0.75, delta=delta, n_cal=300, draws=400)
    # at most delta, up to Monte-Carlo noise (3 standard errors of 400 draws)
    assert out["violation_rate"] <= delta + 3 * np.sqrt(delta * (1 - delta) / 400)
    assert 0.2 < out["mean_escalation_rate"] < 0.9  # it does not hide behind escalating everything


def test_naive_threshold_would_violate():
    """The same search without the binomial bound (empirical accuracy >= target) misses the target
    far more often than delta: the guarantee is the bound's doing."""
    s, a, b = population()
    rng = np.random.default_rng(1)
    misses = 0
    for _ in range(200):
        idx = rng.integers(0, len(s), 300)
        curve = C.cascade_curve(s[idx], a[idx], b[idx])
        ok = curve["accuracy"] >= 0.75
        t = curve["threshold"][np.flatnonzero(ok)[-1]]  # the lowest escalation rate that looks fine
        misses += np.mean(np.where(s <= t, a, b)) < 0.75
    assert misses / 200 > 0.3


def test_rates_ties_and_random():
    s = np.array([0.0, 1.0, 1.0, 2.0])
    small = np.array([1, 0, 1, 0])
    large = np.array([1, 1, 0, 1])
    assert C.accuracy_at_rate(s, small, large, 0.0) == 0.5
    assert C.accuracy_at_rate(s, small, large, 0.25) == 0.75  # the score-2 question escalated
    # two questions tie at score 1 for the second escalation: half of each is escalated on average
    assert C.accuracy_at_rate(s, small, large, 0.5) == pytest.approx((1 + 1 + 0.5 + 0.5) / 4)
    assert C.accuracy_at_rate(s, small, large, 1.0) == 0.75
    assert C.random_accuracy_at_rate(small, large, 0.5) == pytest.approx(0.625)
    curve = C.cascade_curve(s, small, large)
    assert curve["escalation_rate"][0] == 1.0 and curve["escalation_rate"][-1] == 0.0


def test_out_of_reach_escalates_all():
    s, a, _ = population(2000)
    t = C.cascade_threshold(s, a, np.zeros(2000), target=0.99, delta=0.1)
    assert not t.achievable and t.escalation_rate == 1.0
    assert t.to_dict()["escalates_all"] and t.to_dict()["threshold"] is None


def _run(path, model, rows):
    path.mkdir()
    (path / "run.json").write_text(json.dumps({"config": {"model": model}}))
    with (path / "samples.jsonl").open("w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")


def test_cli_cascade(tmp_path):
    s, a, b = population(400, seed=3)

    def rows(correct, scores):
        return [
            {
                "task": "t",
                "id": str(i),
                "measures": {"g-nll": float(x)},
                "correctness": {"f1": {"correct": bool(c)}},
            }
            for i, (x, c) in enumerate(zip(scores, correct, strict=True))
        ]

    _run(tmp_path / "small", "s", rows(a, s))
    _run(tmp_path / "large", "l", rows(b, 5 * s) + [rows([1], [0.0])[0] | {"id": "only-large"}])
    out = tmp_path / "cascade.json"
    res = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--cascade",
            str(tmp_path / "small"),
            str(tmp_path / "large"),
            "--target-accuracy",
            "0.7",
            "-o",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["n"] == 400 and doc["small"]["model"] == "s"
    assert doc["threshold"]["achievable"] and doc["threshold"]["accuracy_lower"] >= 0.7 - 1e-9
    assert [r["escalation_rate"] for r in doc["at_rates"]] == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert all(r["gated"] > r["random"] for r in doc["at_rates"])
    assert (tmp_path / "cascade.png").stat().st_size > 1000
    assert "1 rows in only one run" in res.output
    # the file is CascadeThreshold's: versioned, with the prompt format of gnll eval's runs
    assert doc["format"] == C.FORMAT and doc["prompt_format"] == "instruction"
    back = C.CascadeThreshold.load(out)
    assert back.threshold == doc["threshold"]["threshold"] and back.meta["n"] == 400
    res = CliRunner().invoke(app, ["calibrate", "--cascade", str(tmp_path / "small")])
    assert res.exit_code == 2 and "two eval runs" in res.output


def test_weaker_upstream_is_left_alone():
    """The second test sequence (from escalating none) certifies the small model alone when the
    upstream is the weaker one: the order of the models need not be known in advance."""
    s, a, _ = population(2000)
    t = C.cascade_threshold(s, a, np.zeros(2000), target=0.45, delta=0.1)
    assert t.achievable and t.escalation_rate == 0.0 and t.accuracy >= 0.45
