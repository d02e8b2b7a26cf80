"""In-process tool calls on a scripted model (no weights): ``tool_choice: "auto"`` through the
batching engine, the per-argument NLLs of the scripted log-probs, streams, and the gate."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest
from serve_helpers import ScriptedModel
from tool_sets import GET_WEATHER

from gnll.backends.base import Generation
from gnll.policy import AbstentionPolicy
from gnll.serving import ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread

TOOLS = [GET_WEATHER]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
# one token per 4 characters, log-probs -0.1, -0.2, ...
TOKENS = [CALL[i : i + 4] for i in range(0, len(CALL), 4)]
LPS = [-0.1 * (k + 1) for k in range(len(TOKENS))]
USER = [{"role": "user", "content": "Weather in Paris?"}]


class CallingModel(ScriptedModel):
    """Calls get_weather whenever the prompt lists tools; else the scripted answers."""

    name = "calling"

    def generate(self, prompts, config=None, **kwargs):
        if not any("<tools>" in p for p in prompts):
            return super().generate(prompts, config, **kwargs)
        return [[Generation(CALL, list(range(len(TOKENS))), TOKENS, LPS, "eos")] for _ in prompts]


@pytest.fixture(scope="module")
def servers():
    model = CallingModel()
    plain = ServerThread(build_inprocess_app(model, ServeSettings(), max_wait_ms=1))
    gate = ServerThread(
        build_inprocess_app(
            model,
            ServeSettings(
                policy=AbstentionPolicy(mode="refuse", threshold=100.0), tool_argument_threshold=0.5
            ),
            max_wait_ms=1,
        )
    )
    with plain as a, gate as b:
        yield a, b


def _client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)


def test_auto_call_is_parsed_and_each_part_sums_its_tokens(servers):
    r = _client(servers[0]).chat.completions.create(
        model="calling", messages=USER, tools=TOOLS, logprobs=True
    )
    choice = r.choices[0]
    [call] = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    rec = choice.uncertainty["tool_calls"][0]
    [arg] = rec["arguments"]
    assert arg["path"] == "city" and arg["text"] == "Paris"
    # the tokens the record names spell the value, and its NLL is theirs
    assert "Paris" in "".join(TOKENS[k] for k in arg["token_indices"])
    assert math.isclose(arg["nll"], -sum(LPS[k] for k in arg["token_indices"]), abs_tol=1e-12)  # same path: float64 sums of the same log-probs
    assert math.isclose(rec["g_nll"], -sum(LPS[k] for k in rec["token_indices"]), abs_tol=1e-12)  # same path: float64 sums of the same log-probs
    assert choice.uncertainty["g_nll"] == pytest.approx(-sum(LPS))


def test_no_tools_or_tool_choice_none_is_a_plain_answer(servers):
    c = _client(servers[0])
    r = c.chat.completions.create(model="calling", messages=USER, tools=TOOLS, tool_choice="none")
    assert r.choices[0].message.tool_calls is None and "tool_calls" not in r.choices[0].uncertainty


def test_required_needs_a_model_that_decodes_under_a_grammar(servers):
    with pytest.raises(openai.BadRequestError, match="grammar"):
        _client(servers[0]).chat.completions.create(
            model="calling", messages=USER, tools=TOOLS, tool_choice="required"
        )


@pytest.mark.parametrize("stream", [False, True])
def test_argument_over_its_threshold_withholds_the_call_without_leaking_it(servers, stream):
    body = {
        "model": "calling",
        "messages": USER,
        "tools": TOOLS,
        "stream": stream,
        "logprobs": True,
    }
    raw = httpx.post(servers[1].url + "/v1/chat/completions", json=body, timeout=30).text
    assert "Paris" not in raw.replace("Weather in Paris?", "")
    assert '{\\"city\\"' not in raw and '"tool_calls": [{"id"' not in raw
    events = (
        [json.loads(x[6:]) for x in raw.splitlines() if x.startswith("data: {")]
        if stream
        else [json.loads(raw)]
    )
    last = events[-1]["choices"][0]
    rec = last["uncertainty"]
    assert rec["refused"] and rec["tool_calls"][0]["withheld"]
    assert rec["tool_calls"][0]["arguments_over_threshold"] == ["city"]
    assert rec["tool_calls"][0]["abstain"] is False  # the call's G-NLL alone passes
    assert last["finish_reason"] == "stop"


def test_metrics_and_access_log_count_calls_without_argument_texts(servers, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="gnll.serve.access"):
        for srv in servers:
            _client(srv).chat.completions.create(model="calling", messages=USER, tools=TOOLS)
    metrics = [httpx.get(srv.url + "/metrics").text for srv in servers]
    assert 'gnll_tool_calls_total{outcome="sent"}' in metrics[0]
    assert 'gnll_tool_calls_total{outcome="withheld"}' in metrics[1]
    assert "gnll_tool_call_max_argument_nll_count" in metrics[0]
    entries = [json.loads(r.message) for r in caplog.records if '"tool_calls"' in r.message]
    assert len(entries) == 2
    assert [e["tool_calls"][0][0]["withheld"] for e in entries] == [False, True]
    assert all("Paris" not in json.dumps(e["tool_calls"]) for e in entries)
