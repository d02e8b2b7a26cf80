"""Exact early decisions on tool calls (``--policy refuse``/``escalate``): decoding stops at the
token where a call's G-NLL, or one argument value's NLL, crosses its threshold, with the same
decision as decoding to the end; the record says where (``decided_at_token``, ``tokens_saved``).

The real engine and app around a scripted decoding loop (serve_helpers' FakeDecoder, one token a
step, counted) for ``tool_choice: "auto"``, and a scripted grammar loop (``generate_constrained``
with its ``watch``) for ``"required"``; SmolLM2's own grammar loop is in the model test below."""

from __future__ import annotations

import json

import httpx
import pytest
from serve_helpers import EOS, FakeDecoder, StreamingModel, serve
from tool_sets import GET_WEATHER

from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.backends.constrained import ConstrainedGeneration
from gnll.policy import AbstentionPolicy

TOOLS = [GET_WEATHER]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris, France"}}\n</tool_call>'
TOKENS = [CALL[i : i + 4] for i in range(0, len(CALL), 4)]
CITY = CALL.index("Paris")
# every token -0.01 but those inside the city's value, -1.0 each
LPS = [
    -1.0 if 4 * k + 3 >= CITY and 4 * k < CITY + len("Paris, France") else -0.01
    for k in range(len(TOKENS))
]
MAX_TOKENS = 60


class _CallDecoder(FakeDecoder):
    def add(self, tag, ids, prefix=None, **kw) -> None:
        super().add(tag, ids, prefix, **kw)
        if "<tools>" in "".join(chr(i) for i in ids):  # the tool prompt: the call's script
            tag_, _, cap, watch = self.waiting[-1]
            self.waiting[-1] = (tag_, (TOKENS, LPS), cap, watch)


class Caller(StreamingModel):
    """A decoding loop that answers a tool prompt with CALL, and a grammar loop that decodes
    CALL under ``tool_choice: "required"`` (each counts the tokens it generates)."""

    def __init__(self) -> None:
        super().__init__(delay=0.0)
        for t in TOKENS:
            self.ids.setdefault(t, len(self.ids) + 1)
        self.tokenizer.vocab.update({i: w for w, i in self.ids.items()})
        self.constrained = 0

    def open_decoder(self, config, *, width=None):
        return _CallDecoder(self, config, width or 1)

    def generate_constrained(self, prompt, grammar, *, max_new_tokens, raw_prompt=False, watch=None):
        assert '"get_weather"' in grammar
        n, finish = len(TOKENS), "stop"
        for k, (t, lp) in enumerate(zip(TOKENS, LPS, strict=True)):
            self.constrained += 1
            if watch is not None and watch(t, lp):
                n, finish = k + 1, "decided"
                break
        return ConstrainedGeneration(
            "".join(TOKENS[:n]),
            [self.ids[t] for t in TOKENS[:n]],
            TOKENS[:n],
            LPS[:n],
            [0.0] * n,
            finish,
            [EOS] if finish == "stop" else [],
        )


def _crossing(threshold: float) -> int:
    """The number of tokens read when the city's running NLL first exceeds ``threshold``."""
    total = 0.0
    for k, lp in enumerate(LPS):
        total -= lp
        if total > threshold:
            return k + 1
    raise AssertionError("never crosses")


def _ask(srv, choice, stream=False):
    body = {
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": TOOLS,
        "tool_choice": choice,
        "max_tokens": MAX_TOKENS,
        "stream": stream,
        "logprobs": True,
    }
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.text


def _last(raw, stream):
    if not stream:
        return json.loads(raw)["choices"][0]
    events = [json.loads(x[6:]) for x in raw.splitlines() if x.startswith("data: {")]
    return [c for e in events for c in e["choices"] if c.get("finish_reason")][-1]


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_an_argument_crossing_its_threshold_stops_decoding_there_with_the_same_decision(choice):
    runs = {}
    for early in (True, False):
        model = Caller()
        policy = AbstentionPolicy(mode="refuse", threshold=100.0)
        with serve(model, policy=policy, tool_argument_threshold=1.5, early=early) as srv:
            runs[early] = _last(_ask(srv, choice), False), model.generated + model.constrained
    (on, made_on), (off, made_off) = runs[True], runs[False]
    at = _crossing(1.5)  # the second token of the city (2.0 > 1.5)
    assert 0 < at < len(TOKENS)
    u_on, u_off = on["uncertainty"], off["uncertainty"]
    # the same decision: the call withheld, for its argument
    for u in (u_on, u_off):
        assert u["refused"] is True and u["abstain"] is True
        [c] = u["tool_calls"]
        assert c["withheld"] is True and c["arguments_over_threshold"] == ["city"]
        assert c["name"] == "get_weather"
    assert on["message"].get("tool_calls") is None and "get_weather" in on["message"]["content"]
    # decided at the crossing token; the rest was never generated
    assert u_on["early"] is True and u_on["decided_at_token"] == at
    assert u_on.get("tool_call_error") is None  # the block stopped at its decision is no error
    assert u_on["tokens_generated"] == made_on == at
    assert u_on["tokens_saved"] == MAX_TOKENS - at
    assert made_off == len(TOKENS) + (1 if choice == "auto" else 0)  # (+ the loop's EOS step)
    assert "early" not in u_off and not u_off["tool_calls"][0].get("early")
    # the call's NLLs so far are the full run's over the same tokens
    [c_on], [c_off] = u_on["tool_calls"], u_off["tool_calls"]
    assert c_on["early"] is True
    assert c_on["g_nll"] == pytest.approx(
        -sum(LPS[k] for k in c_on["token_indices"]), abs=BATCH_INVARIANCE_ATOL
    )
    assert set(c_on["token_indices"]) <= set(c_off["token_indices"])
    [a_on], [a_off] = c_on["arguments"], c_off["arguments"]
    assert a_on["nll"] == pytest.approx(2.0, abs=BATCH_INVARIANCE_ATOL)
    assert a_on["nll"] < a_off["nll"]
    assert a_on["token_indices"] == a_off["token_indices"][: len(a_on["token_indices"])]


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_a_call_g_nll_crossing_the_policys_threshold_stops_there(choice):
    model = Caller()
    with serve(model, policy=AbstentionPolicy(mode="refuse", threshold=1.0)) as srv:
        u = _last(_ask(srv, choice), False)["uncertainty"]
    [c] = u["tool_calls"]
    assert c["withheld"] is True and c["abstain"] is True and c["g_nll"] > 1.0
    assert u["decided_at_token"] < len(TOKENS) and u["tokens_saved"] > MAX_TOKENS - len(TOKENS)


@pytest.mark.parametrize("stream", [False, True])
def test_an_early_withheld_call_leaks_no_byte(stream):
    with serve(
        Caller(), policy=AbstentionPolicy(mode="refuse", threshold=100.0), tool_argument_threshold=1.5
    ) as srv:
        raw = _ask(srv, "auto", stream)
    assert "Paris" not in raw.replace("Weather in Paris?", "")
    last = _last(raw, stream)
    assert last["uncertainty"]["early"] is True and last["uncertainty"]["tool_calls"][0]["withheld"]
    assert last["finish_reason"] == "stop"


def test_a_sure_call_is_sent_whole_under_early_decisions():
    model = Caller()
    with serve(
        model, policy=AbstentionPolicy(mode="refuse", threshold=100.0), tool_argument_threshold=50
    ) as srv:
        last = _last(_ask(srv, "auto"), False)
    assert last["finish_reason"] == "tool_calls"
    [call] = last["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris, France"}
    assert "early" not in last["uncertainty"]
