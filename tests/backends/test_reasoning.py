"""The reasoning splitter (gnll.backends.reasoning): trace | marker | answer, for every response shape.

The fixtures under tests/fixtures/reasoning/ are CONSTRUCTED to the servers' shapes (see
make_fixtures.py there), except the REAL vLLM recordings (``vllm_olmo3_*``, ``responses.json``:
record_vllm.py, tests/backends/test_reasoning_vllm_recorded.py): 8 trace tokens, ``</think>``, a 2-token answer "The answer is 4." (NLL 0.15),
the whole output's NLL 4.16.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnll.backends.base import Generation, GenerationConfig
from gnll.backends.openai.client import ServerError
from gnll.backends.openai.parse import read_choice, to_generation
from gnll.backends.openai.reasoning import ReasoningStream, responses_answer_choice, split_choice
from gnll.backends.reasoning import (
    HARMONY,
    THINK,
    ReasoningError,
    ReasoningSplit,
    reasoning_format,
    split_tokens,
)

FIX = Path(__file__).parents[1] / "fixtures" / "reasoning"
ANSWER_NLL, TRACE_NLL, WHOLE_NLL = 0.15, 3.81, 4.16


def load(name: str):
    return json.loads((FIX / name).read_text())


def sse_choices(name: str) -> list[dict]:
    out = []
    for line in (FIX / name).read_text().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.extend(json.loads(line[6:])["choices"])
    return out


def generation(choice: dict, **kw) -> Generation:
    raw = read_choice(choice, **kw)
    return to_generation(raw, GenerationConfig.greedy(), eos_logprob=True, where="choice 0")


def test_the_fixture_numbers_are_the_issues():
    entries = load("vllm_chat.json")["choices"][0]["logprobs"]["content"]
    assert -math.fsum(e["logprob"] for e in entries) == pytest.approx(WHOLE_NLL)
    assert -math.fsum(e["logprob"] for e in entries[:4]) == pytest.approx(2.2)


@pytest.mark.parametrize("name", ["vllm_chat.json", "llamacpp_chat.json"])
def test_non_stream_scores_the_answer_only(name):
    g = generation(load(name)["choices"][0])
    assert g.text == "The answer is 4."
    assert g.tokens == ["The answer is", " 4."]
    assert -g.logprob == pytest.approx(ANSWER_NLL)
    s = g.reasoning
    assert (s.trace_tokens, s.marker_tokens, s.answer_tokens, s.split_at) == (8, 1, 2, 9)
    assert s.trace_nll == pytest.approx(TRACE_NLL)  # the marker (0.2) is not trace
    assert s.marker_logprobs == (-0.2,) and s.source == "marker"


def test_token_ids_locate_the_marker_when_its_ids_are_known():
    choice = load("vllm_chat.json")["choices"][0]
    # the marker's string rendered differently, its id is what the server generated
    choice["logprobs"]["content"][8]["token"] = "?"
    choice["logprobs"]["content"][8]["bytes"] = [63]
    with pytest.raises(ServerError, match="no end-of-reasoning marker"):
        read_choice(choice)
    g = generation(choice, marker_ids=[151668])
    assert g.reasoning.source == "token_ids" and g.reasoning.split_at == 9
    assert -g.logprob == pytest.approx(ANSWER_NLL)


def test_vllm_stream_labels_each_token_by_its_delta():
    rs = ReasoningStream()
    past = []
    for c in sse_choices("vllm_chat_stream.sse"):
        rs.add(c)
        past.append(rs.past_marker)
    # role chunk, 8 reasoning chunks, the empty-delta marker chunk; the answer begins after it
    assert past.index(True) == 1 + 8 + 1
    s = rs.split()
    assert (s.trace_tokens, s.marker_tokens, s.answer_tokens) == (8, 1, 2)
    assert rs.answer_start == 9 and s.marker_logprobs == (-0.2,)
    assert s.trace_nll == pytest.approx(TRACE_NLL)


def test_llamacpp_stream_without_the_marker_says_so():
    rs = ReasoningStream()
    for c in sse_choices("llamacpp_chat_stream.sse"):
        rs.add(c)
    s = rs.split()
    assert (s.trace_tokens, s.marker_tokens, s.answer_tokens) == (8, 0, 2)
    assert not s.marker_reported and s.marker_logprobs is None
    assert "no token for the end-of-reasoning marker" in s.notes[0]


def test_reasoning_without_alignable_logprobs_is_refused_not_scored_whole():
    choice = load("vllm_chat_no_marker.json")["choices"][0]
    with pytest.raises(ServerError) as err:
        generation(choice)
    msg = str(err.value)
    assert "cannot be aligned" in msg and "\n" not in msg


def test_output_cut_inside_the_reasoning_is_refused():
    choice = load("vllm_chat.json")["choices"][0]
    choice["logprobs"]["content"] = choice["logprobs"]["content"][:5]
    choice.update(finish_reason="length", token_ids=None)
    choice["message"]["content"] = None
    with pytest.raises(ServerError, match="inside the reasoning"):
        generation(choice)


def test_harmony_channels():
    g = generation(load("vllm_harmony.json")["choices"][0])
    s = g.reasoning
    assert s.format == "harmony" and g.tokens == ["4"]
    # <|channel|>analysis<|message|>We add. are trace; <|end|>...final<|message|> the marker
    assert (s.trace_tokens, s.marker_tokens, s.answer_tokens) == (6, 6, 2)
    assert -g.logprob == pytest.approx(0.25)  # <|return|> is the terminator


def test_responses_api_output_text_logprobs_cover_the_whole_output_on_vllm():
    """responses.json is a REAL vLLM 0.32 recording (record_vllm.py): its ``output_text`` log-probs
    cover trace, marker and answer (as its chat route's do), so the answer is split off at the
    marker; the answer's G-NLL is the one the chat recording of the same question gives."""
    resp = load("responses.json")
    choice, s = responses_answer_choice(resp)
    g = to_generation(read_choice(choice), GenerationConfig.greedy(), eos_logprob=True, where="r")
    chat = generation(load("vllm_olmo3_chat.json")["choices"][0])
    assert g.text == chat.text == "The answer is Paris."
    assert g.tokens == chat.tokens and g.token_logprobs == chat.token_logprobs
    assert s.source == "marker" and s.trace_reported
    whole = resp["output"][1]["content"][0]["logprobs"]
    assert s.num_tokens == len(whole) and s.answer_start - s.trace_end == 4  # </ think > \n
    # the constructed shape this recording replaced (answer-only log-probs) is still read as such
    answer_only = load("responses.json")
    answer_only["output"][1]["content"][0]["logprobs"] = whole[s.answer_start : -1]
    choice, s2 = responses_answer_choice(answer_only)
    assert s2.source == "responses" and not s2.trace_reported
    assert [e["token"] for e in choice["logprobs"]["content"]] == chat.tokens
    empty = load("responses.json")
    empty["output"][1]["content"][0]["logprobs"] = []
    with pytest.raises(ReasoningError, match="no `output_text` log-probs"):
        responses_answer_choice(empty)


def test_no_parser_upstream_splits_the_text_when_told_the_format():
    choice = load("vllm_chat.json")["choices"][0]
    msg = choice["message"]
    msg["content"] = msg.pop("reasoning") + "</think>" + msg["content"]
    plain = generation(json.loads(json.dumps(choice)))  # nothing says it reasons: scored whole
    assert plain.reasoning is None
    g = generation(choice, reasoning="think")
    assert g.text == "The answer is 4." and -g.logprob == pytest.approx(ANSWER_NLL)


def test_a_choice_without_reasoning_is_untouched():
    choice = json.loads((Path(__file__).parents[1] / "fixtures/vllm/chat_stop.json").read_text())
    c = choice["choices"][0]
    assert split_choice(c) == (c, None)
    g = generation(c)
    assert g.reasoning is None and "reasoning" not in g.to_dict()


def test_split_survives_a_generation_round_trip():
    g = generation(load("vllm_chat.json")["choices"][0])
    again = Generation.from_dict(json.loads(json.dumps(g.to_dict())))
    assert again == g and isinstance(again.reasoning, ReasoningSplit)


def test_formats():
    assert reasoning_format("think") is THINK and reasoning_format("harmony") is HARMONY
    s = split_tokens(["I", " guess", " Final", " answer", ":", " 4"], "marker: Final answer:")
    assert (s.trace_tokens, s.marker_tokens, s.answer_tokens) == (2, 3, 1)
    with pytest.raises(ReasoningError, match="unknown reasoning format"):
        reasoning_format("cot")


# ---------------------------------------------------------------- properties
word = st.text(alphabet="abcdefgh .,é漢", min_size=1, max_size=4)


def _expected(trace, marker, answer):
    """White space the model writes after the marker is the marker's (when an answer follows)."""
    lead = next((i for i, t in enumerate(answer) if t.strip()), 0) if marker else 0
    return len(trace), len(marker) + lead, len(answer) - lead


def _cut(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:], strict=False) if b > a]


@settings(max_examples=200, deadline=None)
@given(
    trace=st.lists(word, min_size=0, max_size=12),
    answer=st.lists(word, min_size=1, max_size=6),
    marker_cuts=st.lists(st.integers(0, 8), max_size=3),
    lps=st.lists(st.floats(-20, 0), min_size=40, max_size=40),
)
def test_split_partitions_every_token_exactly(trace, answer, marker_cuts, lps):
    """trace + marker + answer = all tokens: nothing dropped, nothing counted twice."""
    marker = _cut("</think>", marker_cuts)
    tokens = trace + marker + answer
    values = lps[: len(tokens)]
    s = split_tokens(tokens, THINK, logprobs=values)
    n_trace, n_marker, n_answer = _expected(trace, marker, answer)
    assert (s.trace_tokens, s.marker_tokens, s.answer_tokens) == (n_trace, n_marker, n_answer)
    assert s.trace_tokens + s.marker_tokens + s.answer_tokens == len(tokens)
    assert [s.label(i) for i in range(len(tokens))] == (
        ["trace"] * n_trace + ["marker"] * n_marker + ["answer"] * n_answer
    )
    whole = math.fsum(values)
    parts = (
        math.fsum(s.trace_logprobs)
        + math.fsum(s.marker_logprobs)
        + math.fsum(values[s.answer_start :])
    )
    assert parts == pytest.approx(whole, abs=1e-9)  # same path: float64 sums of the same log-probs


@settings(max_examples=200, deadline=None)
@given(
    trace=st.lists(word, min_size=1, max_size=10),
    answer=st.lists(word, min_size=1, max_size=6),
    group=st.integers(1, 3),
    llamacpp=st.booleans(),
)
def test_stream_labels_partition_every_token(trace, answer, group, llamacpp):
    """However the server groups tokens into chunks, the stream split equals the token split."""
    rows = (
        [(t, "reasoning") for t in trace] + [("</think>", None)] + [(t, "content") for t in answer]
    )
    if llamacpp:
        rows = [r for r in rows if r[1] is not None]
    rs = ReasoningStream()
    for k in range(0, len(rows), group):
        part = rows[k : k + group]
        delta: dict = {}
        for tok, key in part:
            if key:
                delta[key] = delta.get(key, "") + tok
        rs.add(
            {
                "delta": delta,
                "logprobs": {"content": [{"token": t, "logprob": -1.0} for t, _ in part]},
            }
        )
    s = rs.split()
    n_trace, n_marker, n_answer = _expected(trace, [] if llamacpp else ["</think>"], answer)
    assert s.trace_tokens + s.marker_tokens + s.answer_tokens == len(rows)
    assert (s.trace_tokens, s.marker_tokens, s.answer_tokens) == (n_trace, n_marker, n_answer)
    assert s.marker_reported is not llamacpp
    # the answer's start is known while streaming once a token other than white space arrived,
    # and it is where the final split puts it
    if any(t.strip() for t in answer):
        assert rs.answer_start == s.answer_start
    else:
        assert rs.answer_start is None
