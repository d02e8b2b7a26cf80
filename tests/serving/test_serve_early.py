"""`gnll serve --model` with exact early decisions: an answer that will be refused or escalated stops
at the token where that is certain, with the same decision as waiting for its end.

The fast tests run the real engine and app around the scripted decoding loop of serve_helpers
(one token per step, counted); the model test runs SmolLM2 on TriviaQA questions both ways.
"""

from __future__ import annotations

import httpx
import pytest
from serve_helpers import (
    LONG,
    ScriptedModel,
    StreamingModel,
    ask,
    check_refused_early,
    escalating,
    serve,
)

from gnll.measures import g_nll
from gnll.measures.early import EarlyDecisionError
from gnll.serving import AbstentionPolicy, ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread


def test_refused_answer_stops_at_the_decision_token_with_the_same_decision():
    policy = AbstentionPolicy(mode="refuse", threshold=3.0)
    runs = {}
    for early in (True, False):
        model = StreamingModel()
        with serve(model, policy=AbstentionPolicy(mode="refuse", threshold=3.0), early=early) as s:
            runs[early] = ask(s, "long"), model.generated
    (on, made_on), (off, made_off) = runs[True], runs[False]
    # LONG is 200 tokens of log-prob -0.5: G-NLL passes 3.0 at the 7th (3.5 > 3.0).
    u_on, u_off = check_refused_early(on, off)
    assert made_on == u_on["tokens_generated"] == 7
    assert u_on["tokens_saved"] == 100 - 7
    assert made_off == 100 and u_off["g_nll"] == g_nll(LONG[1][:100])
    assert "early" not in u_off
    assert policy.decide(u_off["g_nll"])[1] == policy.decide(u_on["g_nll"])[1]


def test_an_answer_the_policy_keeps_runs_to_its_end():
    model = StreamingModel()
    with serve(model, policy=AbstentionPolicy(mode="refuse", threshold=3.0)) as s:
        c = ask(s, "capital?")
    assert c["text"] == "Paris." and c["uncertainty"]["abstain"] is False
    assert "early" not in c["uncertainty"]


def test_tokens_held_for_a_stop_string_are_not_counted():
    # Stop string " w2 w3": from " w2" on, every token may belong to it and is held back, so the
    # rule only ever sees " w0 w1" (G-NLL 1.0 <= 1.4) and never decides early, although the
    # generated tokens' G-NLL passes 1.4 at the third. (The scripted loop does not cut stop strings,
    # so the finished answer is all 30 tokens and is refused at its end.)
    model = StreamingModel()
    with serve(model, policy=AbstentionPolicy(mode="refuse", threshold=1.4)) as s:
        r = httpx.post(
            s.url + "/v1/completions",
            json={"prompt": "long", "max_tokens": 30, "stop": [" w2 w3"]},
            timeout=60,
        ).json()["choices"][0]["uncertainty"]
    assert "early" not in r and model.generated == 30 and r["abstain"] is True


def test_escalation_starts_at_the_decision_token():
    model = StreamingModel()
    settings = ServeSettings(policy=AbstentionPolicy(mode="escalate", threshold=2.0))
    with escalating(model, ScriptedModel(), settings, escalate_model="scripted") as s:
        c = ask(s, "long")
    u = c["uncertainty"]
    assert u["escalated"] is True and u["local"]["early"] is True
    assert u["local"]["decided_at_token"] == 5 and model.generated == 5
    assert u["local"]["text"] == " w0 w1 w2 w3 w4"  # what the local model had said by then


def test_metrics_and_otel_events_say_where_the_decision_was_made(otel):
    from gnll.serving.tracing import Emitter

    exp, provider = otel
    policy = AbstentionPolicy(mode="refuse", threshold=3.0)
    with serve(StreamingModel(), policy=policy, tracing=Emitter(provider)) as s:
        ask(s, "long")
        ask(s, "capital?")
        metrics = httpx.get(s.url + "/metrics").text
    assert 'gnll_early_decisions_total{action="refuse"} 1.0' in metrics
    assert "gnll_early_tokens_saved_total 93.0" in metrics
    attrs = [dict(getattr(e, "log_record", e).attributes) for e in exp.get_finished_logs()]
    early = [a for a in attrs if "gnll.early_decision.token" in a]
    assert len(early) == 1 and early[0]["gnll.early_decision.token"] == 7
    assert early[0]["gnll.early_decision.tokens_saved"] == 93
    assert early[0]["gen_ai.evaluation.score.label"] == "abstain"


def test_early_decisions_are_refused_where_they_cannot_be_exact():
    with pytest.raises(EarlyDecisionError, match="use mode refuse or escalate"):
        ServeSettings(policy=AbstentionPolicy(mode="flag", threshold=1.0), early=True)
    # By default they are simply off for such policies.
    assert not ServeSettings(policy=AbstentionPolicy(mode="flag", threshold=1.0)).decides_early
    assert ServeSettings(policy=AbstentionPolicy(mode="refuse", threshold=1.0)).decides_early


@pytest.mark.model
def test_smollm_same_decisions_with_and_without_early_stopping(smollm):
    """Ten TriviaQA questions, asked for long answers: every refusal is the same both ways, the
    early ones stop at or before the full answer's end, and tokens are saved overall."""
    from gnll.evaluation.data.tasks import get_task

    td = get_task("triviaqa_long").load()
    prompts = [td.prompt(ex) for ex in td.split("eval", 10)]
    out = {}
    for early in (True, False):
        with serve(smollm, policy=AbstentionPolicy(mode="refuse", threshold=8.0), early=early) as s:
            out[early] = [ask(s, p, max_tokens=60)["uncertainty"] for p in prompts]
    saved = 0
    for on, off in zip(out[True], out[False], strict=True):
        assert on["abstain"] == off["abstain"]
        if on.get("early"):
            assert on["g_nll"] <= off["g_nll"] and on["decided_at_token"] <= off["num_tokens"]
            saved += off["num_tokens"] - on["tokens_generated"]
        else:
            assert on["g_nll"] == off["g_nll"]
    assert any(u.get("early") for u in out[True]) and saved > 0


@pytest.mark.model
def test_cascade_smollm_to_gemma_escalates_the_same_questions_early(smollm, gemma):
    """SmolLM2 -> Gemma-3-270M on TriviaQA questions with long answers, under the calibrated escalate
    policy: the same questions escalate with and without early decisions, to the same Gemma answer,
    and the escalated ones stop SmolLM2 at or before the end of its answer."""
    from gnll.evaluation.data.tasks import get_task

    td = get_task("triviaqa_long").load()
    prompts = [td.prompt(ex) for ex in td.split("eval", 6)]
    policy = AbstentionPolicy(mode="escalate", threshold=12.0)
    out = {}
    with ServerThread(build_inprocess_app(gemma, ServeSettings(), max_wait_ms=5)) as up:
        for early in (True, False):
            settings = ServeSettings(policy=policy, early=early)
            app = build_inprocess_app(
                smollm, settings, max_wait_ms=5, escalate_to=up.url + "/v1", escalate_model=None
            )
            with ServerThread(app) as s:
                out[early] = [ask(s, p, max_tokens=60) for p in prompts]
    assert any(c["uncertainty"]["escalated"] for c in out[False])
    for on, off in zip(out[True], out[False], strict=True):
        u_on, u_off = on["uncertainty"], off["uncertainty"]
        assert u_on["escalated"] == u_off["escalated"]
        if u_off["escalated"]:
            assert on["text"] == off["text"]  # Gemma's answer either way
            local_on, local_off = u_on["local"], u_off["local"]
            assert local_on["early"] is True
            assert local_on["decided_at_token"] <= local_off["num_tokens"]
            assert local_on["g_nll"] <= local_off["g_nll"]
        else:
            assert on["text"] == off["text"] and "early" not in u_on


def test_serve_early_on_a_policy_that_cannot_decide_early_is_one_line():
    from typer.testing import CliRunner

    from gnll.cli.main import app

    args = ["serve", "--model", "smollm2-135m-instruct", "--policy", "flag", "--threshold", "1"]
    result = CliRunner().invoke(app, [*args, "--early"])
    assert result.exit_code == 2
    out = result.output.strip()
    assert out.startswith("gnll serve: --early:") and "--policy refuse or escalate" in out
    assert "\n" not in out and "Traceback" not in out
