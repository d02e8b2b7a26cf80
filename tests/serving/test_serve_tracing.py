"""`gnll serve --otel`: one gen_ai.evaluation.result event per score, through the OpenTelemetry SDK's
in-memory exporter; off by default, and then neither gnll's tracing nor the SDK is imported (FastAPI
itself imports the OpenTelemetry *API* when it is installed; that is not ours)."""

from __future__ import annotations

import subprocess
import sys

import openai
import pytest
from serve_helpers import ScriptedModel, otel_events

from gnll.serving import AbstentionPolicy, ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread
from gnll.serving.tracing import Emitter
from gnll.uncertainty import Uncertainty


def test_one_event_per_score_with_label_and_response_id(otel):
    exp, provider = otel
    settings = ServeSettings(
        policy=AbstentionPolicy(mode="flag", threshold=1.0), tracing=Emitter(provider)
    )
    with ServerThread(build_inprocess_app(ScriptedModel(), settings, max_wait_ms=5)) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)
        sure = c.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "q"}]
        )
        unsure = c.completions.create(model="scripted", prompt="unsure")
        streamed = list(c.completions.create(model="scripted", prompt="unsure", stream=True))
        sampled = c.completions.create(model="scripted", prompt="q", temperature=0.9)
    got = otel_events(exp)
    assert [e["gen_ai.evaluation.name"] for e in got] == ["g_nll"] * 3  # none for the sample
    assert got[0]["gen_ai.response.id"] == sure.id
    assert got[0]["gen_ai.evaluation.score.value"] == pytest.approx(0.03)
    assert got[0]["gen_ai.evaluation.score.label"] == "answer"
    assert got[1]["gen_ai.response.id"] == unsure.id
    assert got[1]["gen_ai.evaluation.score.label"] == "abstain"
    assert got[2]["gen_ai.response.id"] == streamed[0].id
    assert got[2]["gen_ai.evaluation.score.value"] == pytest.approx(5.0)
    assert sampled.choices[0].uncertainty["g_nll"] is None


def test_p_correct_and_escalate_labels(otel):
    exp, provider = otel
    emitter = Emitter(provider)
    record = Uncertainty(
        decoding="greedy",
        g_nll=2.0,
        nll=2.0,
        num_tokens=3,
        p_correct=0.25,
        abstain=True,
        escalated=True,
        answered_by="big",
    )
    n = emitter.emit([record], "chatcmpl-1")
    assert n == 2
    got = otel_events(exp)
    assert [(e["gen_ai.evaluation.name"], e["gen_ai.evaluation.score.value"]) for e in got] == [
        ("g_nll", 2.0),
        ("p_correct", 0.25),
    ]
    assert {e["gen_ai.evaluation.score.label"] for e in got} == {"escalate"}
    assert got[0]["gen_ai.response.id"] == "chatcmpl-1"


@pytest.mark.e2e  # a fresh interpreter: what is imported without --otel
def test_off_by_default_imports_nothing():
    code = (
        "import sys\n"
        "from serve_helpers import ScriptedModel\n"
        "from gnll.serving import ServeSettings, build_inprocess_app\n"
        "from gnll.cli.main import app\n"
        "build_inprocess_app(ScriptedModel(), ServeSettings())\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'gnll.serving.tracing')))\n"
        "assert not bad, bad\n"
    )
    import pathlib

    here = pathlib.Path(__file__).resolve().parents[1]  # tests/, where serve_helpers is
    res = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]


def test_a_reasoning_models_event_says_the_score_is_the_answers(otel):
    exp, provider = otel
    record = Uncertainty(
        decoding="greedy",
        g_nll=0.15,
        nll=0.15,
        num_tokens=2,
        scored="answer",
        trace_nll=3.81,
        trace_tokens=8,
    )
    plain = Uncertainty(decoding="greedy", g_nll=0.2, nll=0.2, num_tokens=1)
    assert Emitter(provider).emit([record, plain], "chatcmpl-1") == 2
    got = otel_events(exp)
    assert got[0]["gnll.scored"] == "answer" and got[0]["gnll.trace_nll"] == pytest.approx(3.81)
    assert got[0]["gnll.trace_tokens"] == 8 and got[0]["gen_ai.evaluation.score.value"] == 0.15
    assert not any(k.startswith("gnll.") for k in got[1])
