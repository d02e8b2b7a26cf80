"""``gnll generate --policy refuse``: refused rows withheld, decided as ``gnll serve`` decides."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import gnll
from gnll.backends.base import BATCH_INVARIANCE_ATOL, Generation, GenerationConfig
from gnll.calibration import Calibrator
from gnll.cli.main import app
from gnll.policy import DEFAULT_REFUSAL
from gnll.serving import AbstentionPolicy
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
        (["--policy", "refuse"], "--policy 'refuse' needs --calibration FILE or --threshold"),
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


# ---------------------------------------------------------------- early decisions
def _stream_questions(tmp_path: Path) -> Path:
    p = tmp_path / "sq.jsonl"
    p.write_text("".join(json.dumps({"question": q}) + "\n" for q in ("sure", "unsure", "long")))
    return p


@pytest.fixture
def streaming(monkeypatch):
    from tests.serve_helpers import StreamingModel

    class LoopModel(StreamingModel):
        """Its generate is its decoding loop run to the end: the answers of both paths agree."""

        def generate(self, prompts, config=None, **kw):
            dec = self.open_decoder(config, width=len(prompts))
            for i, row in enumerate(self.encode(prompts)):
                dec.add(i, row, max_new_tokens=config.max_new_tokens)
            done = {}
            while dec.busy:
                done.update(dec.step())
            return [done[i] for i in range(len(prompts))]

    m = LoopModel(delay=0.0)
    monkeypatch.setattr(gnll, "load_model", lambda name, **kw: m)
    return m


def _early_run(tmp_path, *extra, name):
    out = tmp_path / name
    args = ["generate", "-i", str(_stream_questions(tmp_path)), "-o", str(out), "--no-progress"]
    args += ["--prompt_format", "text", "--max_new_tokens", "100", "--policy", "refuse"]
    res = runner.invoke(app, [*args, "--threshold", "1.2", *extra])
    assert res.exit_code == 0, res.output
    return [json.loads(x) for x in out.read_text().splitlines()]


def test_early_decisions_stop_refused_answers_and_equal_the_end_of_answer_ones(tmp_path, streaming):
    from tests.serve_helpers import STREAM_SCRIPT, SURE

    rows = _early_run(tmp_path, name="early.jsonl")
    policy = AbstentionPolicy(mode="refuse", threshold=1.2)
    # the end-of-answer decision: the policy on the whole (capped) answer's G-NLL
    whole = [SURE[1], STREAM_SCRIPT["unsure"][1], STREAM_SCRIPT["long"][1][:100]]
    assert [r["refused"] for r in rows] == [policy.decide(-sum(lps))[1] for lps in whole]
    assert [r["refused"] for r in rows] == [False, True, True]
    sure, unsure, long = rows
    assert sure["answer"] == "Paris." and "decided_at_token" not in sure
    assert (unsure["decided_at_token"], unsure["tokens_generated"]) == (1, 1)  # 2.0 > 1.2
    assert (long["decided_at_token"], long["tokens_generated"]) == (3, 3)  # 1.5 > 1.2
    assert long["tokens_saved"] == 97 and long["early"] is True
    assert long["g_nll"] == pytest.approx(1.5) and long["g_nll_is_lower_bound"] is True
    # tokens really not generated: the loop decoded 3 + 1 tokens for the refused rows, and
    # "Paris." with its EOS (3), instead of 100 + 3 + 3
    assert streaming.generated == 3 + 1 + 3
    assert all("w3" not in json.dumps(r) and "Lyon" not in json.dumps(r) for r in rows[1:])


def test_no_early_decodes_every_token_with_the_same_decisions(tmp_path, streaming):
    early = _early_run(tmp_path, name="early.jsonl")
    streaming.generated = 0
    full = _early_run(tmp_path, "--no_early", name="full.jsonl")
    assert [r["refused"] for r in full] == [r["refused"] for r in early]
    assert all("decided_at_token" not in r for r in full)
    assert [r["num_tokens"] for r in full] == [2, 2, 100]
    assert streaming.generated == 3 + 3 + 100  # every token decoded (EOS included), not 3 + 1 + 3


def test_early_asked_for_where_it_cannot_be_exact_is_one_line(tmp_path, streaming):
    res = runner.invoke(
        app,
        ["generate", "-i", str(_stream_questions(tmp_path)), "-o", str(tmp_path / "o.jsonl")]
        + ["--policy", "refuse", "--threshold", "1", "--early", "--measures", "g-nll,ln-g-nll"],
    )
    assert res.exit_code == 2 and "--early" in res.stderr and "--measures g-nll" in res.stderr


@pytest.mark.model
def test_early_decisions_on_smollm2_equal_the_end_of_answer_decisions(
    tmp_path, smollm, monkeypatch
):
    monkeypatch.setattr(gnll, "load_model", lambda name, **kw: smollm)
    qs = [
        "What is the capital of France?",
        "Who wrote Moby-Dick?",
        "What is the largest planet?",
        "Who painted the Mona Lisa?",
        "In which year did the Berlin Wall fall?",
        "What is the chemical symbol for gold?",
    ]
    inp = tmp_path / "q.jsonl"
    inp.write_text("".join(json.dumps({"question": q}) + "\n" for q in qs))

    def run(*extra, name):
        out = tmp_path / name
        args = ["generate", "-i", str(inp), "-o", str(out), "--no-progress", *extra]
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        return [json.loads(x) for x in out.read_text().splitlines()]

    plain = run(name="plain.jsonl")
    pol = ["--policy", "refuse", "--threshold", "1.5"]
    early, full = run(*pol, name="early.jsonl"), run(*pol, "--no_early", name="full.jsonl")
    assert [r["refused"] for r in early] == [r["refused"] for r in full]
    assert [r["refused"] for r in full] == [r["g_nll"] > 1.5 for r in plain]
    assert 0 < sum(r["refused"] for r in early) < len(qs)  # the test splits the questions
    for e, f, p in zip(early, full, plain, strict=True):
        if not f["refused"]:  # kept answers: identical through the loop and through generate
            assert e["answer"] == f["answer"] == p["answer"]
            assert e["g_nll"] == pytest.approx(f["g_nll"], abs=BATCH_INVARIANCE_ATOL)
        else:
            assert e["tokens_generated"] <= p["num_tokens"]
            assert e["decided_at_token"] == e["num_tokens"]
            assert e["tokens_saved"] == 50 - e["tokens_generated"] > 0  # against max_new_tokens
            assert e["g_nll"] <= p["g_nll"] + 1e-9 and e["g_nll"] > 1.5
    assert (
        sum(
            p["num_tokens"] - e["tokens_generated"]
            for e, p in zip(early, plain, strict=True)
            if e["refused"]
        )
        > 0
    )
