"""gnll.policy: the one policy object every surface obeys. It checks itself, pins requests, decides
answers, holds streams, and the library (not only the CLI) refuses a set-up that never decides.

Each ``R<n>`` test failed on the code before the policy left the server (issue 44's defects)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import gnll
from gnll._util.validation import ParameterError
from gnll.backends.reasoning_model import ReasoningModel
from gnll.calibration import Calibrator
from gnll.calibration.fitting import FORMAT
from gnll.cli.main import app
from gnll.integrations.core import AnswerScorer, make_policy
from gnll.policy import DEFAULT_REFUSAL, AbstentionPolicy, Answer, escalated, kept, scored_of
from gnll.serving import ServeSettings, build_inprocess_app, create_app
from gnll.serving.engine import BatchingEngine
from gnll.serving.inprocess import InProcessService
from gnll.uncertainty import Uncertainty
from tests.serve_helpers import STREAM_SCRIPT, SURE, ScriptedModel, Thinker

ISOTONIC = {"kind": "isotonic", "x": [0.0, 5.0], "y": [0.9, 0.1]}


def _calibration(scored: str | None = None, prompt_format: str = "chat") -> Calibrator:
    spec = {"format": FORMAT, "method": "isotonic", "prompt_format": prompt_format, "map": ISOTONIC}
    if scored is not None:
        spec["scored"] = scored
    return Calibrator.from_dict(spec)


# ---------------------------------------------------------------- the policy checks itself
@pytest.mark.parametrize("mode", ["flag", "refuse", "escalate"])
def test_a_deciding_policy_without_a_rule_is_refused_naming_mode(mode):
    with pytest.raises(ParameterError, match="needs calibrator or threshold") as caught:
        AbstentionPolicy(mode=mode)
    assert caught.value.param == "mode"


def test_a_refuse_rule_that_refuses_everything_is_refused():
    with pytest.raises(ParameterError, match="would refuse every answer") as caught:
        AbstentionPolicy(mode="refuse", threshold=-1.0)
    assert caught.value.param == "mode"
    AbstentionPolicy(mode="flag", threshold=-1.0)  # flags every answer: allowed, it sends them


def test_a_calibration_fitted_on_other_answers_than_the_models_is_refused():
    cal = _calibration()  # fitted on whole outputs
    with pytest.raises(ParameterError, match="does not fit this model") as caught:
        AbstentionPolicy(mode="refuse", calibrator=cal, min_p_correct=0.5, scored="answer")
    assert caught.value.param == "calibrator"
    AbstentionPolicy(mode="refuse", calibrator=cal, min_p_correct=0.5, scored="output")
    thinking = AbstentionPolicy(calibrator=_calibration("answer"), scored="answer")
    with pytest.raises(ParameterError, match="whole outputs"):
        thinking.check_scored("output")


def test_refuse_with_a_calibration_without_fitted_threshold_is_refused():
    with pytest.raises(ParameterError, match="no fitted threshold") as caught:
        AbstentionPolicy(mode="refuse", calibrator=_calibration())
    assert caught.value.others == ("min_p_correct",)


def test_r1_an_integration_policy_refuse_without_a_rule_is_refused():
    # before: make_policy("refuse") was accepted, and the scorer never refused (G-NLL 9, kept)
    with pytest.raises(ParameterError, match="needs calibrator or threshold"):
        make_policy("refuse")
    scorer = AnswerScorer(policy=make_policy("refuse", threshold=1.0))
    s = scorer.score(" Lyon", {"content": [{"token": " Lyon", "logprob": -9.0}]})
    assert s.refused and s.text == DEFAULT_REFUSAL and s.uncertainty.tokens is None


# ---------------------------------------------------------------- pin, decide, wrap
def test_pin_asks_for_log_probs_and_greedy_decoding():
    pol = AbstentionPolicy(mode="refuse", threshold=1.0)
    assert pol.pin({"model": "m"}, top_logprobs=2) == {
        "model": "m",
        "logprobs": True,
        "top_logprobs": 2,
        "temperature": 0.0,
    }
    assert pol.pin({"temperature": 0, "top_logprobs": 5})["top_logprobs"] == 5
    with pytest.raises(ParameterError, match="greedy answer") as caught:
        pol.pin({"temperature": 0.7})
    assert caught.value.param == "temperature"
    assert AbstentionPolicy().pin({"temperature": 0.7})["temperature"] == 0.7
    # the server asks the same question of a typed request (400 under refuse)
    assert not pol.takes_sampled and AbstentionPolicy(mode="flag", threshold=1.0).takes_sampled


def test_decide_an_answer_gives_the_record_and_what_the_caller_sees():
    answer = Answer(" Lyon.", "stop", [" Lyon", "."], [-4.0, -1.0])
    kept_ = AbstentionPolicy(mode="flag", threshold=1.0).decide(answer, "chat")
    assert (kept_.text, kept_.refused, kept_.uncertainty.abstain) == (" Lyon.", False, True)
    assert kept_.uncertainty.g_nll == pytest.approx(5.0) and kept_.uncertainty.spans
    refused = AbstentionPolicy(mode="refuse", threshold=1.0, refusal="No.").decide(answer)
    assert (refused.text, refused.refused, refused.uncertainty.spans) == ("No.", True, None)
    # the float form is unchanged
    assert AbstentionPolicy(threshold=1.0).decide(5.0) == (None, True)


def _wrap(policy: AbstentionPolicy, pieces: list[str], *, refuse: bool) -> tuple[list, list]:
    """What ``wrap`` sends, and the pieces the stream had produced when each was sent."""
    produced: list[str] = []

    def stream():
        for p in pieces:
            produced.append(p)
            yield p

    def settle(unsent):
        return ["<refusal>"] if refuse else [*unsent[:-1], unsent[-1] + "+record"]

    sent = []
    for out in policy.wrap(stream(), settle):
        sent.append((out, len(produced)))
    return [s for s, _ in sent], [n for _, n in sent]


def test_wrap_holds_a_refusing_policys_stream_until_it_is_decided():
    refuse = AbstentionPolicy(mode="refuse", threshold=1.0)
    assert _wrap(refuse, ["a", "b", "c"], refuse=True) == (["<refusal>"], [3])
    assert _wrap(refuse, ["a", "b", "c"], refuse=False) == (["a", "b", "c+record"], [3, 3, 3])
    # a policy that never withholds sends each piece as the next one arrives
    live = AbstentionPolicy(mode="flag", threshold=1.0)
    assert _wrap(live, ["a", "b", "c"], refuse=False) == (["a", "b", "c+record"], [2, 3, 3])
    assert list(refuse.wrap(iter(["a"]), lambda u: u, greedy=False)) == ["a"]


def test_awrap_takes_an_async_settle():
    async def stream():
        for p in ("a", "b"):
            yield p

    async def settle(unsent):
        await asyncio.sleep(0)
        yield "+".join(unsent)

    async def run(policy):
        return [p async for p in policy.awrap(stream(), settle)]

    assert asyncio.run(run(AbstentionPolicy(mode="escalate", threshold=1.0))) == ["a+b"]
    assert asyncio.run(run(AbstentionPolicy())) == ["a", "b"]


def test_escalation_records():
    rec = Uncertainty(decoding="greedy", g_nll=5.0, ln_g_nll=2.5, nll=5.0, num_tokens=2)
    [k] = kept([rec], "small", "upstream down")
    assert (k.answered_by, k.escalated, k.escalation_error) == ("small", False, "upstream down")
    [e] = escalated([rec], answered_by="large", local=rec, local_text="Lyon", local_model="small")
    assert (e.answered_by, e.escalated, e.local.text, e.local.model) == (
        "large",
        True,
        "Lyon",
        "small",
    )
    assert e.local.g_nll == 5.0


# ---------------------------------------------------------------- R4: observers reach the app
class _Heard:
    def __init__(self) -> None:
        self.events: list = []

    def answered(self, event) -> None:
        self.events.append(event)


def test_r4_create_app_and_build_inprocess_app_pass_observers():
    # before: gnll.serving.create_app(service, settings) had no observers= and dropped it
    body = {"model": "scripted", "prompt": "unsure", "max_tokens": 4}
    for build in (
        lambda heard: build_inprocess_app(ScriptedModel(), max_wait_ms=1, observers=[heard]),
        lambda heard: create_app(
            InProcessService(ScriptedModel(), BatchingEngine(ScriptedModel(), max_wait_ms=1)),
            ServeSettings(),
            observers=[heard],
        ),
    ):
        heard = _Heard()
        with TestClient(build(heard)) as client:
            r = client.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        [event] = heard.events
        assert event.records[0].g_nll == pytest.approx(5.0)


# ---------------------------------------------------------------- R6: the library refuses
def test_r6_the_library_refuses_a_reasoning_server_whose_calibration_never_decides():
    # before: accepted, and every answer then had p_correct None and abstain None
    pol = AbstentionPolicy(mode="refuse", calibrator=_calibration(), min_p_correct=0.5)
    with pytest.raises(ParameterError, match="does not fit this model") as caught:
        build_inprocess_app(ReasoningModel(Thinker(), "think"), ServeSettings(policy=pol))
    assert caught.value.param == "calibrator"
    build_inprocess_app(ScriptedModel(), ServeSettings(policy=pol))  # whole outputs: it fits
    assert scored_of(ReasoningModel(Thinker(), "think")) == "answer"
    assert scored_of(ScriptedModel()) == "output"


# ---------------------------------------------------------------- R5: gnll generate, calibrated
def test_r5_calibrated_generate_on_a_reasoning_model_with_early_decisions(tmp_path, monkeypatch):
    """A calibration fitted on a reasoning model's answers refuses with early decisions on (the
    default), as with them off; before, every row failed its own calibration's check."""
    thinker = Thinker()
    monkeypatch.setattr(
        gnll, "load_model", lambda name, *, reasoning=None, **kw: ReasoningModel(thinker, reasoning)
    )
    rng = np.random.default_rng(0)
    scores = rng.uniform(0, 4, 400)
    cal = Calibrator(target_coverage=None).fit(scores, (scores < 1.2).astype(int))
    cal.meta.update(model="thinker", prompt_format="text", scored="answer")
    cal.save(tmp_path / "cal.json")
    inp = tmp_path / "q.jsonl"
    inp.write_text("".join(json.dumps({"question": q}) + "\n" for q in ("sure", "unsure", "long")))

    def run(name: str, *extra: str) -> list[dict]:
        out = tmp_path / name
        args = ["generate", "-i", str(inp), "-o", str(out), "--no-progress"]
        args += ["--prompt_format", "text", "--model_args", "reasoning=think"]
        args += ["--max_new_tokens", "100", "--policy", "refuse"]
        res = CliRunner().invoke(app, [*args, "--calibration", str(tmp_path / "cal.json"), *extra])
        assert res.exit_code == 0, res.output
        return [json.loads(x) for x in Path(out).read_text().splitlines()]

    early, full = run("early.jsonl"), run("full.jsonl", "--no-early")
    policy = AbstentionPolicy(mode="refuse", calibrator=cal)
    whole = [SURE[1], STREAM_SCRIPT["unsure"][1], STREAM_SCRIPT["long"][1][:100]]
    expected = [policy.decide(-sum(lps), "text", "answer")[1] for lps in whole]
    assert expected == [False, True, True]
    assert [r["refused"] for r in early] == [r["refused"] for r in full] == expected
    assert early[1].get("early") is True and "early" not in full[1]


def test_a_callback_that_only_observes_cannot_take_a_withholding_policy():
    from gnll.integrations.core import observing_policy

    for mode in ("refuse", "escalate"):
        with pytest.raises(ParameterError, match="a callback only observes") as caught:
            observing_policy(mode, threshold=1.0, escalate=True)
        assert caught.value.param == "policy"
    assert observing_policy("flag", threshold=1.0).mode == "flag"
