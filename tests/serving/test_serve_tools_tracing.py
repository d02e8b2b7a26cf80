"""``gnll serve --otel`` with tool calls: one ``gen_ai.evaluation.result`` event per call (its
name, G-NLL, least certain argument's path and NLL, whether it was withheld), never the argument
texts; through the OpenTelemetry SDK's in-memory exporter, as tests/serving/test_serve_tracing.py."""

from __future__ import annotations

import json
import math

import openai
import pytest
from serve_helpers import otel_events
from test_serve_tools import LPS, TOOLS, USER, CallingModel

from gnll.policy import AbstentionPolicy
from gnll.serving import ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread
from gnll.serving.tracing import Emitter


@pytest.mark.parametrize("gate", [False, True])
def test_one_event_per_tool_call_with_its_numbers_and_no_argument_text(otel, gate):
    exp, provider = otel
    policy = AbstentionPolicy(mode="refuse", threshold=100.0) if gate else AbstentionPolicy()
    settings = ServeSettings(
        policy=policy, tool_argument_threshold=0.5 if gate else None, tracing=Emitter(provider)
    )
    with ServerThread(build_inprocess_app(CallingModel(), settings, max_wait_ms=1)) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)
        r = c.chat.completions.create(model="calling", messages=USER, tools=TOOLS)
    rec = r.choices[0].uncertainty
    [call] = rec["tool_calls"]
    got = otel_events(exp)
    calls = [e for e in got if e["gen_ai.evaluation.name"] == "tool_call.g_nll"]
    assert [e["gen_ai.evaluation.name"] for e in got] == ["g_nll", "tool_call.g_nll"]
    [ev] = calls
    assert ev["gen_ai.tool.name"] == "get_weather" and ev["gnll.tool_call.index"] == 0
    assert ev["gen_ai.response.id"] == r.id and ev["gnll.api"] == "chat.completions"
    # the call's own numbers, as the response's record has them
    assert math.isclose(
        ev["gen_ai.evaluation.score.value"], call["g_nll"], abs_tol=1e-12
    )  # same path: one record, two views
    assert ev["gnll.tool_call.least_certain_argument"] == "city"
    nll = call["arguments"][0]["nll"]
    assert math.isclose(
        ev["gnll.tool_call.max_argument_nll"], nll, abs_tol=1e-12
    )  # same path: one record, two views
    assert nll > 0.5 and call["g_nll"] < -sum(LPS)  # a part of the output's G-NLL
    if gate:
        assert ev["gen_ai.evaluation.score.label"] == "withheld"
        assert list(ev["gnll.tool_call.arguments_over_threshold"]) == ["city"]
        assert "gen_ai.tool.call.id" not in ev  # a withheld call was never given one
    else:
        assert ev["gen_ai.evaluation.score.label"] == "sent"
        assert ev["gen_ai.tool.call.id"] == r.choices[0].message.tool_calls[0].id
    assert "Paris" not in json.dumps([{k: str(v) for k, v in e.items()} for e in got])


def test_an_escalated_answer_has_events_for_the_local_models_withheld_calls(otel):
    exp, provider = otel
    from test_serve_tools_escalate import TOOLS as ESC_TOOLS
    from test_serve_tools_escalate import USER as ESC_USER
    from test_serve_tools_escalate import Caller, gated

    with gated(Caller("small", "Pariss", -1.5), tracing=Emitter(provider)) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)
        r = c.chat.completions.create(model="small", messages=ESC_USER, tools=ESC_TOOLS)
    u = r.choices[0].uncertainty
    calls = [e for e in otel_events(exp) if e["gen_ai.evaluation.name"] == "tool_call.g_nll"]
    sent = [e for e in calls if not e.get("gnll.tool_call.local")]
    local = [e for e in calls if e.get("gnll.tool_call.local")]
    assert [e["gen_ai.evaluation.score.label"] for e in sent] == ["sent"]
    assert sent[0]["gen_ai.response.model"] == "big"
    [ev] = local
    assert ev["gen_ai.evaluation.score.label"] == "withheld"
    assert ev["gen_ai.response.model"] == "small" and ev["gen_ai.tool.name"] == "get_weather"
    assert list(ev["gnll.tool_call.arguments_over_threshold"]) == ["city"]
    want = u["local"]["tool_calls"][0]["g_nll"]
    assert math.isclose(
        ev["gen_ai.evaluation.score.value"], want, abs_tol=1e-12
    )  # same path: one record, two views
    assert "Pariss" not in json.dumps([{k: str(v) for k, v in e.items()} for e in calls])
