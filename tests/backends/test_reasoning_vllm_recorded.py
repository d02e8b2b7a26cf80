"""gnll's split of REAL vLLM reasoning responses (tests/fixtures/reasoning/record_vllm.py: vLLM
0.32's CPU build, ``--reasoning-parser olmo3``, the embedded SmolLM2 prompted with few-shot
``<think>…</think>`` turns): the answer gnll scores is the one vLLM's own parser split off, the trace
is vLLM's ``reasoning``, and the chat route, the Responses route and the proxy's pass-through all
give the same G-NLL."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gnll.backends.base import GenerationConfig
from gnll.backends.openai.parse import read_choice, to_generation
from gnll.backends.openai.reasoning import responses_choice
from gnll.policy.choices import choice_answer

FIX = Path(__file__).parents[1] / "fixtures" / "reasoning"


def load(name: str) -> dict:
    return json.loads((FIX / name).read_text())


def test_gnlls_split_is_vllms_own():
    choice = load("vllm_olmo3_chat.json")["choices"][0]
    message = choice["message"]
    entries = choice["logprobs"]["content"]
    raw = read_choice(json.loads(json.dumps(choice)))
    g = to_generation(raw, GenerationConfig.greedy(), eos_logprob=True, where="choice 0")
    split = g.reasoning
    tokens = [e["token"] for e in entries]
    # the trace tokens spell vLLM's reasoning (after the opening <think>), the answer tokens its
    # content (less the new line the marker swallows), the EOS token is the terminator
    assert "".join(tokens[: split.trace_end]) == "<think>" + message["reasoning"]
    assert "".join(tokens[split.trace_end : split.answer_start]) == "</think>\n"
    assert "".join(g.tokens) == message["content"].lstrip() == g.text
    assert tokens[split.answer_start : split.num_tokens - 1] == g.tokens
    assert g.terminator_logprobs == [entries[-1]["logprob"]]
    assert split.trace_text == message["reasoning"]
    answer_nll = -math.fsum(e["logprob"] for e in entries[split.answer_start : -1])
    assert -math.fsum(g.token_logprobs) == pytest.approx(answer_nll, abs=1e-12)  # same path: one recording
    # the trace is far less sure than the answer: scoring the whole output would mislead
    assert -math.fsum(split.trace_logprobs) > 5 * answer_nll


def test_the_responses_route_and_the_proxys_reading_give_chats_g_nll():
    chat = choice_answer(
        load("vllm_olmo3_chat.json")["choices"][0], GenerationConfig.greedy(), eos_logprob=True
    )
    resp = load("responses.json")
    kinds = [item["type"] for item in resp["output"]]
    assert kinds == ["reasoning", "message"]
    own = choice_answer(responses_choice(resp), GenerationConfig.greedy(), eos_logprob=True)
    assert own.text == chat.text and own.tokens == chat.tokens
    assert own.token_logprobs == pytest.approx(chat.token_logprobs, abs=1e-4)
    assert own.reasoning.trace_text == chat.reasoning.trace_text


def test_a_stream_behind_a_few_shot_prompt_is_not_split_by_vllm():
    """What vLLM 0.32 streams for the same request: every delta is ``content`` (the olmo3 parser
    finds the few-shot turns' ``</think>`` in the prompt and takes the trace as ended), so nothing
    in the stream says which tokens are trace; gnll scores what it is told is the answer."""
    deltas = []
    for line in (FIX / "vllm_olmo3_chat_stream.sse").read_text().splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                deltas.append(choice["delta"])
    assert not any(d.get("reasoning") or d.get("reasoning_content") for d in deltas)
    text = "".join(d.get("content") or "" for d in deltas)
    whole = load("vllm_olmo3_chat.json")["choices"][0]["message"]
    assert text == "<think>" + whole["reasoning"] + "</think>" + whole["content"]


def test_the_proxy_keeps_vllms_own_split_on_the_choice_it_returns():
    """The proxy decorates the upstream's choice in place: vLLM's reasoning and content (its answer
    starts with a new line) stay as vLLM split them. The old reader took the new line for the
    trace of a parser-less upstream and put ``"\n"`` in ``message.reasoning``."""
    choice = load("vllm_olmo3_chat.json")["choices"][0]
    before = dict(choice["message"])
    answer = choice_answer(choice, GenerationConfig.greedy(), eos_logprob=True)
    assert choice["message"]["reasoning"] == before["reasoning"] == "The capital of France is Paris."
    assert choice["message"]["content"] == before["content"]
    assert answer.reasoning is not None and answer.reasoning.trace_text == before["reasoning"]
