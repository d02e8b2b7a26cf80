"""``gnll decide`` (streaming, resumable, never clobbers, bad rows to the errors file),
``gnll calibrate --decisions`` and the calibrated answers with their guarantee, on a tiny
random-weight model (in this process, through typer's runner)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from gnll.calibration.decisions import DecisionCalibration, decision_score
from gnll.cli.main import app

PRED = {"type": "predicate", "name": "p", "instructions": "Is the number even?"}
CHOICE = {
    "type": "choice",
    "name": "c",
    "instructions": "Which word is in the text?",
    "choices": [{"value": "apple"}, {"value": "river stone"}, {"value": "cloud"}],
}


def _rows(n: int) -> list[dict]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        out.append(
            {
                "id": i,
                "input": f"The number is {i}. The text says {['apple', 'river stone', 'cloud'][i % 3]}.",
                "questions": [PRED, CHOICE],
                "labels": [i % 2 == 0, ["apple", "river stone", "cloud"][int(rng.integers(3))]],
            }
        )
    return out


@pytest.fixture(scope="module")
def model_path(tiny_llama):
    return str(tiny_llama())


def _write(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _decide(model_path, *args):
    return CliRunner().invoke(
        app, ["decide", "--model", model_path, "--no_progress", *map(str, args)]
    )


def test_decide_streams_resumes_and_never_clobbers(tmp_path, model_path):
    rows = _rows(5)
    bad = [{"id": "x", "questions": [PRED]}, {"id": "y", "input": "hi", "questions": "nope"}]
    src = tmp_path / "rows.jsonl"
    _write(src, rows[:2] + bad + rows[2:])
    out = tmp_path / "out.jsonl"
    res = _decide(model_path, "-i", src, "-o", out)
    assert res.exit_code == 1, res.output  # two rows failed
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in got] == [0, 1, 2, 3, 4]
    assert [r["input_line"] for r in got] == [1, 2, 5, 6, 7]
    for r in got:
        assert [a["type"] for a in r["answers"]] == ["predicate", "choice"]
        assert r["labels"] and r["model"]
        for a in r["answers"]:
            assert abs(sum(o["probability"] for o in a["probabilities"]) - 1) <= 1e-9  # same path: float64 normalisation
    errs = [
        json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()
    ]
    assert [e["line"] for e in errs] == [3, 4]
    assert "input" in errs[0]["error"] and "questions" in errs[1]["error"]
    # an existing output is not clobbered ...
    before = out.read_bytes()
    res = _decide(model_path, "-i", src, "-o", out)
    assert res.exit_code == 2 and "earlier run" in res.output
    assert out.read_bytes() == before
    # ... and --resume continues after the last written row (cut the file to three rows)
    out.write_text("".join(before.decode().splitlines(keepends=True)[:3]))
    res = _decide(model_path, "-i", src, "-o", out, "--resume")
    again = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in again] == [0, 1, 2, 3, 4]
    for a, b in zip(got, again, strict=True):
        pa = [o["probability"] for o in a["answers"][1]["probabilities"]]
        pb = [o["probability"] for o in b["answers"][1]["probabilities"]]
        assert np.allclose(pa, pb, atol=1e-4)


def test_calibrate_decisions_and_the_stated_guarantee(tmp_path, model_path):
    src, out, cal_path = tmp_path / "rows.jsonl", tmp_path / "out.jsonl", tmp_path / "cal.json"
    _write(src, _rows(40))
    assert _decide(model_path, "-i", src, "-o", out).exit_code == 0
    res = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--decisions",
            str(out),
            "-o",
            str(cal_path),
            "--target-accuracy",
            "0.5",
            "--delta",
            "0.2",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "predicate:" in res.output and "choice:" in res.output
    cal = DecisionCalibration.load(cal_path)
    assert set(cal.types) == {"predicate", "choice"}
    assert cal.alpha == pytest.approx(0.5) and cal.delta == pytest.approx(0.2)
    # applied by gnll decide --calibration: every answer of a calibrated type states its guarantee,
    # and exactly the answers below the threshold are refused, with the reason
    out2 = tmp_path / "calibrated.jsonl"
    res = _decide(model_path, "-i", src, "-o", out2, "--calibration", cal_path)
    assert res.exit_code == 0, res.output
    plain = [json.loads(line) for line in out.read_text().splitlines()]
    calibrated = [json.loads(line) for line in out2.read_text().splitlines()]
    for a_row, b_row in zip(plain, calibrated, strict=True):
        for a, b in zip(a_row["answers"], b_row["answers"], strict=True):
            kind = a["type"]
            t = cal.threshold(kind)
            p = max(o["probability"] for o in a["probabilities"])
            assert "statement" in b["guarantee"] and 0 <= b["p_correct"] <= 1
            refused = b["type"] == "refusal"
            assert refused == (
                not decision_score(p) <= cal.types[kind].thresholds_["accuracy"].threshold
            )
            if refused:
                assert "threshold" in b["reason"] and b["question_type"] == kind
            elif t is not None:
                assert p >= t * (1 - 1e-12)


def test_the_guarantee_holds_over_random_splits():
    """Data whose chosen-option probability is P(correct): the threshold fitted on one half keeps
    accuracy >= 1 - alpha on the other in at least 1 - delta of the splits (binomial margin)."""
    rng = np.random.default_rng(1)
    n, alpha, delta, splits = 600, 0.2, 0.1, 200
    p = rng.uniform(0.25, 1.0, n)
    y = rng.uniform(size=n) < p
    violations = 0
    for _ in range(splits):
        idx = rng.permutation(n)
        cal_i, test_i = idx[: n // 2], idx[n // 2 :]
        s = np.array([decision_score(x) for x in p])
        cal = DecisionCalibration(alpha, delta).fit({"choice": (s[cal_i], y[cal_i])})
        t = cal.threshold("choice")
        answered = p[test_i] >= t
        if answered.any() and y[test_i][answered].mean() < 1 - alpha:
            violations += 1
    assert violations / splits <= delta + 3 * np.sqrt(delta * (1 - delta) / splits)


def test_adaptive_ece_of_constant_predictions_is_one_bin():
    """A calibration map that is flat on the data (a model whose decisions all have the same
    probability) gave no quantile bin at all, and the adaptive ECE divided by zero."""
    from gnll.calibration.metrics import expected_calibration_error

    y = np.array([1, 0, 0, 1, 0])
    ece = expected_calibration_error(np.full(5, 0.3), y, strategy="quantile")
    assert ece == pytest.approx(abs(0.3 - 0.4))


def test_each_option_nll_is_what_gnll_score_gives_it(tmp_path, model_path):
    """`gnll score` of a row with the question's messages and the option as the answer gives the
    option's NLL in `gnll decide`'s output."""
    from gnll.scoring.decisions import parse_questions, question_messages

    row = _rows(1)[0]
    src, out = tmp_path / "rows.jsonl", tmp_path / "out.jsonl"
    _write(src, [row])
    chat = ["--model_args", "chat_template=true"]  # `gnll score` takes messages for a chat model
    assert _decide(model_path, "-i", src, "-o", out, *chat).exit_code == 0
    [decided] = [json.loads(line) for line in out.read_text().splitlines()]
    score_rows, expect = [], []
    for q, a in zip(parse_questions(row["questions"]), decided["answers"], strict=True):
        for o, got in zip(q.options, a["probabilities"], strict=True):
            score_rows.append({"messages": question_messages(row["input"], q), "answer": o.text})
            expect.append(got["nll"])
    _write(tmp_path / "score.jsonl", score_rows)
    res = CliRunner().invoke(
        app,
        [
            "score",
            "--model",
            model_path,
            "--no_progress",
            "-i",
            str(tmp_path / "score.jsonl"),
            "-o",
            str(tmp_path / "scored.jsonl"),
            *chat,
        ],
    )
    assert res.exit_code == 0, res.output
    scored = [
        json.loads(line)["nll"] for line in (tmp_path / "scored.jsonl").read_text().splitlines()
    ]
    from gnll.backends.base import BATCH_INVARIANCE_ATOL

    assert np.allclose(scored, expect, atol=BATCH_INVARIANCE_ATOL)
