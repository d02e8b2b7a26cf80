"""gnll.toolcalls: the documented call format, its strict parse and the partition of a call's NLL.

No model: outputs and their tokens are written by hand (the model tests decode real ones)."""

from __future__ import annotations

import json
import math

import pytest

from gnll.serving.errors import RequestError
from gnll.serving.protocol.tools import ResponseFormat, ToolRequest, tool_call_deltas
from gnll.toolcalls import call_grammar, call_report, parse_output, render_call

NAMES = ["get_weather", "calculator"]


def _tokens(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def test_parse_reads_calls_and_their_argument_spans():
    text = (
        "Let me check.\n"
        + render_call("get_weather", {"city": "Paris", "days": [1, 2], "opt": {"unit": "c"}})
        + "\n"
        + render_call("calculator", {"expression": "2+2"})
    )
    out = parse_output(text, NAMES)
    assert out.error is None and out.content == "Let me check."
    a, b = out.calls
    assert (a.name, b.name) == ("get_weather", "calculator")
    assert json.loads(text[a.start : a.end]) == {
        "name": "get_weather",
        "arguments": {"city": "Paris", "days": [1, 2], "opt": {"unit": "c"}},
    }
    assert text[a.name_segment.start : a.name_segment.end] == "get_weather"
    got = {s.path: text[s.start : s.end] for s in a.argument_segments}
    assert got == {"city": "Paris", "days[0]": "1", "days[1]": "2", "opt.unit": "c"}
    assert json.loads(a.arguments_text) == a.arguments


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>', "no known function"),
        ('<tool_call>\n{"name": "calculator", "arguments": 3}\n</tool_call>', "not a JSON object"),
        ('<tool_call>\n{"name": "calculator", "arguments": {}\n</tool_call>', "not valid JSON"),
        ('<tool_call>\n{"name": "calculator"}\n</tool_call>', 'exactly "name" and "arguments"'),
        ('<tool_call>\n{"name": "calculator", "arguments": {"x": ', "not closed"),
    ],
)
def test_a_malformed_block_is_no_call_and_says_why(text, error):
    out = parse_output(text, NAMES)
    assert out.calls == () and error in (out.error or "")


def test_a_cut_second_block_is_dropped_not_sent_as_text():
    text = render_call("calculator", {"expression": "1"}) + '\n<tool_call>\n{"name": "calc'
    out = parse_output(text, NAMES)
    assert len(out.calls) == 1 and out.content == "" and "not closed" in out.error


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7])
def test_call_parts_partition_the_call_and_the_output(size):
    text = "ok " + render_call("get_weather", {"city": "New York", "n": 12, "f": True}) + "\n"
    text += render_call("calculator", {"expression": "6*7"})
    tokens = _tokens(text, size)
    lps = [-0.01 * (k % 13 + 1) for k in range(len(tokens))]
    calls = parse_output(text, NAMES).calls
    report = call_report(tokens, lps, text, calls, constrained_logprobs=[lp / 2 for lp in lps])
    seen: list[int] = []
    for rec in report:
        parts = [rec["name_tokens"], rec["structure_tokens"]]
        parts += [a["token_indices"] for a in rec["arguments"]]
        flat = sorted(k for p in parts for k in p)
        assert flat == rec["token_indices"]  # the parts partition the call: no token twice
        total = rec["name_nll"] + rec["structure_nll"] + sum(a["nll"] for a in rec["arguments"])
        assert math.isclose(total, rec["g_nll"], abs_tol=1e-9)  # same path: float64 sums of the same log-probs
        assert math.isclose(rec["constrained_g_nll"], rec["g_nll"] / 2, abs_tol=1e-9)  # same path: float64 sums of the same log-probs
        seen += flat
    outside = [k for k in range(len(tokens)) if k not in seen]
    assert len(seen) == len(set(seen))
    whole = -sum(lps)
    calls_nll = sum(r["g_nll"] for r in report)
    assert math.isclose(calls_nll - sum(lps[k] for k in outside), whole, abs_tol=1e-9)  # same path: float64 sums of the same log-probs
    # a single-character tokenizer puts exactly the value's characters in each argument
    if size == 1:
        assert [a["text"] for a in report[0]["arguments"]] == ["New York", "12", "true"]
        assert [a["num_tokens"] for a in report[0]["arguments"]] == [8, 2, 4]
        assert report[0]["least_certain_argument"] in {"city", "n", "f"}


def test_grammar_names_each_allowed_function_with_its_schema():
    g = call_grammar([{"name": "f", "parameters": {"type": "object"}}], parallel=True)
    assert '"const": "f"' in g and '("\\n" block)*' in g and "%json" in g
    assert '"additionalProperties": false' in g  # arguments the schema does not list: none
    with pytest.raises(ValueError, match="at least one function"):
        call_grammar([])


def test_tool_request_shapes_and_refusals():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert ToolRequest.of({"tools": tools, "tool_choice": "none"}) is None
    assert ToolRequest.of({}) is None
    auto = ToolRequest.of({"tools": tools})
    assert auto is not None and not auto.required
    with pytest.raises(RequestError, match="not among the tools"):
        ToolRequest.of(
            {"tools": tools, "tool_choice": {"type": "function", "function": {"name": "g"}}}
        )
    with pytest.raises(RequestError, match="tool_choice needs tools"):
        ToolRequest.of({"tool_choice": "required"})
    with pytest.raises(RequestError, match="same function name"):
        ToolRequest.of({"tools": tools * 2})
    with pytest.raises(RequestError, match="deprecated"):
        ToolRequest.of({"functions": [{"name": "f"}]})
    assert ResponseFormat.of({"response_format": {"type": "text"}}) is None
    with pytest.raises(RequestError, match="needs its json_schema"):
        ResponseFormat.of({"response_format": {"type": "json_schema"}})


def test_stream_deltas_spell_the_calls():
    msg = {
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
        ]
    }
    d = tool_call_deltas(msg)
    assert d[0]["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}
    assert "".join(x["tool_calls"][0]["function"]["arguments"] for x in d) == '{"a": 1}'
