"""``gnll generate --policy refuse``: refused rows withheld, decided as ``gnll serve`` decides."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import gnll
from gnll.backends.base import Generation, GenerationConfig
from gnll.calibration import Calibrator
from gnll.cli.main import app
from gnll.serving import AbstentionPolicy
from gnll.serving.uncertainty import DEFAULT_REFUSAL
from tests.scoring.test_api_ask import ScriptedModel

runner = CliRunner()


class TwoAnswers(ScriptedModel):
    """'Paris' (G-NLL 0.4) unless the question says 'hard': then 'Mars' (G-NLL 3.0)."""

    def generate(self, prompts, config=None, *, batch_size=None, progress=False):
        config = config or GenerationConfig()
        if config.strategy != "greedy":
            return super().generate(prompts, config, batch_size=batch_size, progress=progress)
        self.calls["greedy"] += 1
        return [
            [Generation("Mars", [7, 8], ["Ma", "rs"], [-2.0, -1.0], "stop")]
            if "hard" in p
            else [Generation("Paris", [5, 6], ["Par", "is"], [-0.1, -0.3], "stop")]
            for p in prompts
        ]


@pytest.fixture
def loads(monkeypatch):
    """The model gnll generate loads, and how often it was loaded."""
    calls = []

    def load(name, **kw):
        calls.append(name)
        return TwoAnswers()

    monkeypatch.setattr(gnll, "load_model", load)
    return calls


def _questions(tmp_path: Path) -> Path:
    p = tmp_path / "q.jsonl"
    rows = [{"id": "a", "question": "Capital of France?"}, {"id": "b", "question": "A hard one?"}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _run(tmp_path: Path, *extra: str, name: str = "out.jsonl"):
    out = tmp_path / name
    args = ["generate", "-i", str(_questions(tmp_path)), "-o", str(out), "--no-progress"]
    res = runner.invoke(app, [*args, *extra])
    rows = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else None
    return res, rows, out


def test_refused_rows_are_withheld_with_the_gnll_they_were_decided_on(tmp_path, loads):
    res, rows, _ = _run(tmp_path, "--policy", "refuse", "--threshold", "1.0", "--logprobs")
    assert res.exit_code == 0, res.output
    kept, refused = rows
    assert kept["answer"] == "Paris" and kept["refused"] is False
    assert kept["tokens"] == ["Par", "is"]
    assert refused["refused"] is True and refused["answer"] == DEFAULT_REFUSAL
    assert "Mars" not in json.dumps(refused)  # the text and its tokens are not written anywhere
    assert "tokens" not in refused and "token_logprobs" not in refused
    assert refused["g_nll"] == pytest.approx(3.0)  # the value the refusal was decided on
    # the decision is gnll serve's: AbstentionPolicy's own verdict on each row's G-NLL
    policy = AbstentionPolicy(mode="refuse", threshold=1.0)
    assert [r["refused"] for r in rows] == [policy.decide(r["g_nll"])[1] for r in rows]


def test_refusal_text_and_a_threshold_that_keeps_everything(tmp_path, loads):
    res, rows, _ = _run(tmp_path, "--policy", "refuse", "--threshold", "0.2", "--refusal", "n/a")
    assert res.exit_code == 0, res.output
    assert [r["answer"] for r in rows] == ["n/a", "n/a"]
    res, rows, _ = _run(tmp_path, "--policy", "refuse", "--threshold", "5", name="keep.jsonl")
    assert [(r["answer"], r["refused"]) for r in rows] == [("Paris", False), ("Mars", False)]


def test_default_output_is_unchanged_by_the_policy_options(tmp_path, loads):
    _, plain_rows, _ = _run(tmp_path, name="plain.jsonl")
    assert all("refused" not in r for r in plain_rows)
    assert [r["answer"] for r in plain_rows] == ["Paris", "Mars"]
    _, with_policy, _ = _run(tmp_path, "--policy", "refuse", "--threshold", "5", name="p.jsonl")
    # a policy that refuses nothing adds its column and changes nothing else
    assert [{k: v for k, v in r.items() if k != "refused"} for r in with_policy] == plain_rows


def test_calibrated_policy_refuses_what_the_fitted_rule_abstains_on(tmp_path, loads):
    rng = np.random.default_rng(0)
    scores = rng.uniform(0, 4, 400)
    cal = Calibrator(target_coverage=None).fit(scores, (scores < 1.5).astype(int))
    cal.meta.update(model="scripted")
    cal.save(tmp_path / "cal.json")
    res, rows, _ = _run(tmp_path, "--policy", "refuse", "--calibration", str(tmp_path / "cal.json"))
    assert res.exit_code == 0, res.output
    policy = AbstentionPolicy(mode="refuse", calibrator=cal)
    want = [policy.decide(r["g_nll"], "instruction")[1] for r in rows]
    assert want == [False, True]  # the fitted rule splits the two answers
    assert [r["refused"] for r in rows] == want == [r["abstain"] for r in rows]
    assert rows[1]["answer"] == DEFAULT_REFUSAL and rows[0]["answer"] == "Paris"


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--policy", "refuse"], "needs --threshold or --calibration"),
        (["--policy", "flag", "--threshold", "1"], "--policy flag"),
        (["--threshold", "1"], "without --policy"),
        (["--policy", "refuse", "--threshold", "nan"], "--threshold"),
        (["--policy", "refuse", "--threshold", "1", "--calibration", "auto"], "one of them"),
    ],
)
def test_bad_policy_options_are_one_line_before_the_model_loads(tmp_path, loads, extra, says):
    res, rows, _ = _run(tmp_path, *extra)
    assert res.exit_code == 2, res.output
    assert says in res.stderr and "Traceback" not in res.output
    assert loads == [] and rows is None
