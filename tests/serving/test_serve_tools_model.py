"""Tool calls and structured outputs of in-process ``gnll serve`` on the real SmolLM2, through the
official openai SDK: the calls, their per-argument NLLs against a teacher-forced score of the same
output, streams, and the gate that withholds a call without leaking it."""

from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pytest
from tool_sets import WEATHER_AND_CALCULATOR

from gnll.backends.base import BATCH_INVARIANCE_ATOL, ChatPrompt
from gnll.policy import AbstentionPolicy
from gnll.serving import ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread
from gnll.toolcalls import tool_system_prompt

pytestmark = pytest.mark.model

TOOLS = WEATHER_AND_CALCULATOR
QUESTION = "What is the weather in Paris?"
KW = {"temperature": 0, "max_tokens": 64, "parallel_tool_calls": False}


def _serve(model, **settings):
    srv = ServerThread(build_inprocess_app(model, ServeSettings(**settings)))
    srv.__enter__()
    srv.client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=300)
    return srv


@pytest.fixture(scope="module")
def served(smollm):
    srv = _serve(smollm)
    yield srv
    srv.__exit__(None, None, None)


@pytest.fixture(scope="module")
def required(served, smollm):
    return served.client.chat.completions.create(
        model=smollm.name,
        messages=[{"role": "user", "content": QUESTION}],
        tools=TOOLS,
        tool_choice="required",
        logprobs=True,
        **KW,
    )


def test_required_call_comes_back_as_openai_tool_calls(required):
    choice = required.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name in ("get_weather", "calculator")
    args = json.loads(call.function.arguments)
    rec = choice.uncertainty["tool_calls"][0]
    assert rec["id"] == call.id and rec["name"] == call.function.name
    assert {a["path"] for a in rec["arguments"]} == set(args)


def test_per_call_and_per_argument_nlls_equal_a_teacher_forced_score(required, smollm):
    """The output's tokens scored teacher-forced after the same prompt: the call's G-NLL, the name's
    and each argument value's NLL, summed over the token indices the record names, agree."""
    choice = required.choices[0]
    u = choice.uncertainty
    prompt = ChatPrompt.of(
        [
            {"role": "system", "content": tool_system_prompt(TOOLS)},
            {"role": "user", "content": QUESTION},
        ]
    )
    text = "".join(u["tokens"])
    [ref] = smollm.score([prompt], [text])
    # The grammar's greedy decode is in the tokenizer's canonical tokens, so scoring the output's
    # *text* scores the very tokens served (on the old decode, SmolLM2 spelled "calculator"
    # c+al+cul+ator here, and the text's score was 19.6 nats away).
    assert list(ref.tokens) == u["tokens"]
    lps = np.asarray(ref.token_logprobs)
    assert len(lps) == len(u["token_logprobs"])
    rec = u["tool_calls"][0]

    def nll(ks):
        return -float(np.sum(lps[ks])) if ks else 0.0

    assert rec["g_nll"] == pytest.approx(nll(rec["token_indices"]), abs=BATCH_INVARIANCE_ATOL)
    assert rec["name_nll"] == pytest.approx(nll(rec["name_tokens"]), abs=BATCH_INVARIANCE_ATOL)
    for a in rec["arguments"]:
        assert a["nll"] == pytest.approx(nll(a["token_indices"]), abs=BATCH_INVARIANCE_ATOL)
    # the parts partition the call
    parts = rec["name_tokens"] + rec["structure_tokens"]
    parts += [k for a in rec["arguments"] for k in a["token_indices"]]
    assert sorted(parts) == rec["token_indices"]
    # the argument's tokens spell its value
    for a in rec["arguments"]:
        assert a["text"] in "".join(u["tokens"][k] for k in a["token_indices"])
    assert u["g_nll"] == pytest.approx(-float(np.sum(lps)), abs=BATCH_INVARIANCE_ATOL)


def test_stream_spells_the_same_call(served, smollm, required):
    stream = served.client.chat.completions.create(
        model=smollm.name,
        messages=[{"role": "user", "content": QUESTION}],
        tools=TOOLS,
        tool_choice="required",
        stream=True,
        **KW,
    )
    name, args, finish, unc = None, "", None, None
    for ev in stream:
        for c in ev.choices:
            for tc in c.delta.tool_calls or []:
                name = name or tc.function.name
                args += tc.function.arguments or ""
            finish = c.finish_reason or finish
            unc = getattr(c, "uncertainty", None) or unc
    [call] = required.choices[0].message.tool_calls
    assert (name, args, finish) == (call.function.name, call.function.arguments, "tool_calls")
    assert unc["tool_calls"][0]["g_nll"] == pytest.approx(
        required.choices[0].uncertainty["tool_calls"][0]["g_nll"], abs=BATCH_INVARIANCE_ATOL
    )


def test_named_tool_choice_calls_that_function(served, smollm):
    r = served.client.chat.completions.create(
        model=smollm.name,
        messages=[{"role": "user", "content": "What is 17 times 23?"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "calculator"}},
        **KW,
    )
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "calculator"
    assert set(json.loads(call.function.arguments)) == {"a", "op", "b"}


def test_json_schema_answer_reports_raw_and_constrained_nlls(served, smollm):
    schema = {
        "type": "object",
        "properties": {"capital": {"type": "string"}},
        "required": ["capital"],
    }
    r = served.client.chat.completions.create(
        model=smollm.name,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        **KW,
    )
    choice = r.choices[0]
    value = json.loads(choice.message.content)
    assert set(value) == {"capital"}
    s = choice.uncertainty["structured"]
    assert s["logprobs"] == "raw" and s["type"] == "json_schema"
    [field] = s["fields"]
    assert field["path"] == "$.capital"
    # renormalising over the allowed tokens can only raise a token's probability
    assert 0.0 <= field["constrained_nll"] <= field["nll"] + BATCH_INVARIANCE_ATOL
    assert s["constrained_g_nll"] <= choice.uncertainty["g_nll"] + BATCH_INVARIANCE_ATOL


@pytest.fixture(scope="module")
def gated(smollm):
    """Two gates: every call's G-NLL is above threshold 0; and a threshold no call reaches, with an
    argument threshold every value's NLL is above."""
    a = _serve(smollm, policy=AbstentionPolicy(mode="refuse", threshold=0.0))
    b = _serve(
        smollm,
        policy=AbstentionPolicy(mode="refuse", threshold=1e6),
        tool_argument_threshold=-1.0,
    )
    yield a, b
    a.__exit__(None, None, None)
    b.__exit__(None, None, None)


@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("stream", [False, True])
def test_a_withheld_call_leaks_no_byte(gated, required, smollm, which, stream):
    srv = gated[which]
    [call] = required.choices[0].message.tool_calls
    body = {
        "model": smollm.name,
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": TOOLS,
        "tool_choice": "required",
        "stream": stream,
        "logprobs": True,
        **KW,
    }
    raw = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=300).text
    assert call.function.arguments not in raw  # the arguments never reach the client
    assert '"tool_calls": [{"id"' not in raw and '"tool_calls":[{"id"' not in raw
    assert '"arguments": "' not in raw and "token_logprobs" not in raw
    events = (
        [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
        if stream
        else [json.loads(raw)]
    )
    last = events[-1]["choices"][0]
    rec = last["uncertainty"]
    assert rec["refused"] is True and rec["tool_calls"][0]["withheld"] is True
    assert all("text" not in a for a in rec["tool_calls"][0]["arguments"])
    if which == 1:
        assert rec["tool_calls"][0]["arguments_over_threshold"]
    text = (
        "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
        if stream
        else last["message"]["content"]
    )
    assert "withheld" in text
    # decided early (the default), the call may be withheld before its name was complete
    name = rec["tool_calls"][0]["name"]
    assert name in (None, call.function.name)
    assert (name or "a function not yet named") in text


@pytest.mark.parametrize("gate", ["call", "argument"])
def test_the_grammar_loop_stops_at_the_crossing_token_with_the_same_decision(
    smollm, required, gate
):
    """Early decisions in SmolLM2's own grammar loop: a threshold half-way through the call's
    G-NLL (or its largest argument's NLL) stops decoding at the token where it is crossed; the
    decision is the one decoding to the end makes, and the NLLs so far are the full call's over
    the same tokens."""
    full = required.choices[0].uncertainty
    rec = full["tool_calls"][0]
    lps = full["token_logprobs"]
    if gate == "call":
        settings = {"policy": AbstentionPolicy(mode="refuse", threshold=rec["g_nll"] / 2)}
    else:
        settings = {
            "policy": AbstentionPolicy(mode="refuse", threshold=1e6),
            "tool_argument_threshold": rec["max_argument_nll"] / 2,
        }
    body = {
        "model": smollm.name,
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": TOOLS,
        "tool_choice": "required",
        **KW,
    }
    got = {}
    for early in (True, False):
        srv = _serve(smollm, early=early, **settings)
        try:
            r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=300)
        finally:
            srv.__exit__(None, None, None)
        assert r.status_code == 200, r.text
        got[early] = r.json()["choices"][0]["uncertainty"]
    on, off = got[True], got[False]
    for u in (on, off):
        assert u["refused"] is True and u["tool_calls"][0]["withheld"] is True
    assert "early" not in off
    at = on["decided_at_token"]
    assert on["early"] is True and 0 < at < rec["num_tokens"]
    assert on["tokens_saved"] == KW["max_tokens"] - at
    c = on["tool_calls"][0]
    assert c["early"] is True
    # the NLLs so far: the full (kept) run's log-probs over the same token indices
    assert c["g_nll"] == pytest.approx(
        -sum(lps[k] for k in c["token_indices"]), abs=BATCH_INVARIANCE_ATOL
    )
    assert set(c["token_indices"]) <= set(rec["token_indices"])
    if gate == "call":
        assert c["g_nll"] > rec["g_nll"] / 2
        prefix = [k for k in c["token_indices"] if k < at - 1]
        assert -sum(lps[k] for k in prefix) <= rec["g_nll"] / 2 + BATCH_INVARIANCE_ATOL
    else:
        [path] = c["arguments_over_threshold"]
        a = next(x for x in c["arguments"] if x["path"] == path)
        full_a = next(x for x in rec["arguments"] if x["path"] == path)
        assert a["token_indices"] == full_a["token_indices"][: len(a["token_indices"])]
        assert a["nll"] == pytest.approx(
            -sum(lps[k] for k in a["token_indices"]), abs=BATCH_INVARIANCE_ATOL
        )
        assert a["nll"] > rec["max_argument_nll"] / 2
        assert a["token_indices"][-1] == at - 1  # decided at the argument's crossing token


def test_served_call_nlls_equal_gnll_score_of_the_same_output(required, smollm):
    """`gnll score`'s row path (a row whose answer is the served `tool_calls`, with the same tools
    and messages) gives each call the served G-NLL, name NLL and argument NLLs."""
    from gnll.scoring.stream import ScoreJob, score_chunk

    choice = required.choices[0]
    served = choice.uncertainty
    row = {
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": TOOLS,
        "answer": [c.model_dump() for c in choice.message.tool_calls],
    }
    job = ScoreJob("-", "-", "jsonl", "jsonl", None).for_model(smollm)
    res = score_chunk(smollm, job, [(1, row, None)])
    assert not res.errors, res.errors
    [out] = res.rows
    assert out["nll"] == pytest.approx(served["g_nll"], abs=BATCH_INVARIANCE_ATOL)  # the given answer's
    [got] = out["tool_calls"]
    [rec] = served["tool_calls"]
    assert got["token_indices"] == rec["token_indices"]
    assert got["g_nll"] == pytest.approx(rec["g_nll"], abs=BATCH_INVARIANCE_ATOL)
    assert got["name_nll"] == pytest.approx(rec["name_nll"], abs=BATCH_INVARIANCE_ATOL)
    assert [a["path"] for a in got["arguments"]] == [a["path"] for a in rec["arguments"]]
    for a, b in zip(got["arguments"], rec["arguments"], strict=True):
        assert a["nll"] == pytest.approx(b["nll"], abs=BATCH_INVARIANCE_ATOL)
