"""gnll.toolwatch: the running NLLs of a call read token by token are the complete call's
(gnll.toolcalls.call_report) over the same tokens, and the decision made at the crossing token is
the one the gate makes on the finished output."""

from __future__ import annotations

import random

import pytest

from gnll.toolcalls import call_report, parse_output, render_call
from gnll.toolwatch import CallWatch, ToolCallDecision

NAMES = ["get_weather", "calc", "lookup"]
OUTPUTS = [
    render_call("get_weather", {"city": "Paris"}),
    "Let me check.\n" + render_call("calc", {"a": 12, "b": -3.5e2, "op": "mul"}),
    render_call(
        "lookup", {"q": 'the "Louvre"\\ museum \u00e9t\u00e9', "tags": ["x", 2, True, None]}
    )
    + "\n"
    + render_call("calc", {"a": 1, "nested": {"k": [1, {"z": "w"}]}, "e": {}, "f": []}),
    '<tool_call>\n  {"arguments": {"weird key": false}, "name": "lookup"}  \n</tool_call>',
    render_call("get_weather", {}),
]


def _tokens(text: str, rng: random.Random) -> list[str]:
    out, i = [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        out.append(text[i : i + n])
        i += n
    return out


@pytest.mark.parametrize("text", OUTPUTS)
@pytest.mark.parametrize("seed", range(6))
def test_the_watch_places_every_token_as_the_complete_calls_report(text, seed):
    rng = random.Random(seed)
    tokens = _tokens(text, rng) if seed else [text[i : i + 1] for i in range(len(text))]
    lps = [-rng.random() for _ in tokens]
    watch = CallWatch(lambda g: False)
    for t, lp in zip(tokens, lps, strict=True):
        watch.push(t, lp)
    parsed = parse_output(text, NAMES)
    assert parsed.calls and parsed.error is None
    want = call_report(tokens, lps, text, parsed.calls)
    got = watch.report()
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g["complete"] and g["name"] == w["name"]
        assert g["token_indices"] == w["token_indices"]
        assert g["name_tokens"] == w["name_tokens"]
        assert {a["path"]: a["token_indices"] for a in g["arguments"]} == {
            a["path"]: a["token_indices"] for a in w["arguments"]
        }
        # the same tokens summed the same way: the same bits
        assert g["g_nll"] == w["g_nll"]
        assert [a["nll"] for a in g["arguments"]] == [a["nll"] for a in w["arguments"]]


def _gate(text, tokens, lps, tau, arg_tau):
    """The finished output's decision by call_report (what the gate decides without early
    decisions): whether some call's G-NLL is over tau or an argument's NLL over arg_tau."""
    report = call_report(tokens, lps, text, parse_output(text, NAMES).calls)
    return any(c["g_nll"] > tau or any(a["nll"] > arg_tau for a in c["arguments"]) for c in report)


@pytest.mark.parametrize("seed", range(40))
def test_the_decision_at_the_crossing_token_is_the_finished_outputs(seed):
    rng = random.Random(seed)
    text = OUTPUTS[seed % len(OUTPUTS)]
    tokens = _tokens(text, rng)
    lps = [-(rng.random() ** 6) for _ in tokens]
    tau, arg_tau = rng.uniform(0.5, 12.0), rng.uniform(0.2, 4.0)
    watch = CallWatch(lambda g: g > tau, argument_threshold=arg_tau)
    at = None
    for k, (t, lp) in enumerate(zip(tokens, lps, strict=True)):
        if watch.push(t, lp):
            at = k + 1
            break
    assert watch.decided is _gate(text, tokens, lps, tau, arg_tau)
    if at is not None:
        assert watch.decided_at == at
        # not one token earlier: the prefix before the crossing token had not crossed
        before = CallWatch(lambda g: g > tau, argument_threshold=arg_tau)
        assert not any(before.push(t, lp) for t, lp in zip(tokens[: at - 1], lps, strict=False))
        # and the call it decided on is over one of its thresholds already
        call = watch.report()[watch.decided_call]
        assert call["g_nll"] > tau or call["arguments_over_threshold"]


def test_a_broken_block_is_no_longer_decided_on():
    watch = CallWatch(lambda g: g > 1.0)
    text = "<tool_call>\nnot json, and uncertain"
    assert not any(watch.push(ch, -0.5) for ch in text)
    assert watch.report() == []


def test_only_the_first_call_is_decided_without_parallel_calls():
    text = render_call("calc", {"a": 1}) + "\n" + render_call("calc", {"a": 2})
    tokens = list(text)
    lps = [-0.01] * len(tokens)
    second = text.index("{", len(render_call("calc", {"a": 1})))
    lps[second + 20] = -9.0  # inside the second call only
    assert CallWatch(lambda g: g > 5.0).push  # (a watch for each)
    one = CallWatch(lambda g: g > 5.0, max_calls=1)
    both = CallWatch(lambda g: g > 5.0)
    for t, lp in zip(tokens, lps, strict=True):
        one.push(t, lp)
        both.push(t, lp)
    assert not one.decided and both.decided and both.decided_call == 1


def test_the_decision_object_needs_token_texts_and_reports_the_call():
    rule = ToolCallDecision(lambda g: g > 100.0, action="refuse", argument_threshold=1.0)
    with pytest.raises(ValueError, match="text"):
        rule.release([-0.5])
    text = render_call("get_weather", {"city": "Paris"})
    toks = [text[i : i + 4] for i in range(0, len(text), 4)]
    lps = [-0.01 if "ar" not in t else -2.0 for t in toks]
    decided = [rule.push_token(t, lp) for t, lp in zip(toks, lps, strict=True)]
    k = decided.index(True)
    assert all(decided[k:]) and rule.decision.at_token == k + 1
    assert rule.decision.action == "refuse" and rule.watch.report()[0]["arguments_over_threshold"]
