"""Greedy decoding under a grammar: a prompt prefix shared with the previous call is encoded once
(the model keeps its KV snapshot), with the tokens and log-probs of encoding every prompt whole.

The reference is the same loop with no snapshot (every prompt encoded whole); the two paths are
compared at the documented cross-path tolerance."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tool_sets import CALCULATOR, LOOKUP

from gnll import load_model
from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.backends.hf import constrained
from gnll.toolcalls import call_grammar, tool_system_prompt

pytest.importorskip("llguidance")

TOOLS = [LOOKUP, CALCULATOR]  # the tool-call benchmark's (bench/tool_calls.py)


def reference(
    model: Any, tokenizer: Any, prompt_ids: list[int], grammar: str, n: int, eos: set[int]
):
    """The loop with no prompt snapshot: the whole prompt encoded."""
    model.__dict__.pop("_gnll_prompt_prefix", None)
    g = constrained.generate_constrained(
        model, tokenizer, prompt_ids, grammar, max_new_tokens=n, eos_ids=eos
    )
    model.__dict__.pop("_gnll_prompt_prefix", None)
    return g.token_ids, g.token_logprobs, g.constrained_logprobs, g.finish_reason


class Counting:
    """Counts the forward passes and the input tokens of a model's calls."""

    def __init__(self, model: Any) -> None:
        self.passes = self.tokens = 0
        model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        self.passes += 1
        self.tokens += int(kwargs["input_ids"].shape[1])


def _check(hf: Any, questions: list[str], n: int, context: str = "") -> tuple[list[Any], Counting]:
    grammar = call_grammar([t["function"] for t in TOOLS])
    system = tool_system_prompt(TOOLS) + context
    prompts = [
        hf.encode([f"{system}\nQuestion: {q}\nAnswer:"], raw_prompt=True)[0] for q in questions
    ]
    hf.model.__dict__.pop("_gnll_prompt_prefix", None)
    want = [reference(hf.model, hf.tokenizer, p, grammar, n, hf.eos_ids) for p in prompts]
    counter = Counting(hf.model)
    got = []
    for p, (ids, raw, con, finish) in zip(prompts, want, strict=True):
        g = constrained.generate_constrained(
            hf.model, hf.tokenizer, p, grammar, max_new_tokens=n, eos_ids=hf.eos_ids
        )
        assert g.token_ids == ids and g.finish_reason == finish
        np.testing.assert_allclose(g.token_logprobs, raw, atol=BATCH_INVARIANCE_ATOL, rtol=0)
        np.testing.assert_allclose(g.constrained_logprobs, con, atol=BATCH_INVARIANCE_ATOL, rtol=0)
        got.append(g)
    return [prompts, got], counter


QUESTIONS = ["What is 12 times 7?", "Who wrote Hamlet?", "What is 3 plus 4?"]


def test_a_shared_prompt_prefix_is_encoded_once_with_the_same_tokens_and_logprobs(tiny_llama):
    hf = load_model(str(tiny_llama(max_position_embeddings=2048)), progress=False, device="cpu")
    (prompts, gens), counter = _check(hf, QUESTIONS, 48)
    produced = sum(len(g.token_ids) for g in gens)
    # the tool prompt is encoded for the first two prompts (the second stores the shared prefix),
    # not for the third
    shared = 0
    while prompts[1][shared] == prompts[2][shared]:
        shared += 1
    assert counter.tokens < sum(map(len, prompts)) + produced - shared
    assert shared >= 64


def test_a_prompt_that_does_not_share_the_prefix_is_encoded_whole(tiny_llama):
    hf = load_model(str(tiny_llama(max_position_embeddings=2048)), progress=False, device="cpu")
    grammar = call_grammar([t["function"] for t in TOOLS])
    prompts = [hf.encode([p], raw_prompt=True)[0] for p in ("x " * 80, "x " * 80 + "y", "z " * 80)]
    hf.model.__dict__.pop("_gnll_prompt_prefix", None)
    for p in prompts:
        g = constrained.generate_constrained(
            hf.model, hf.tokenizer, p, grammar, max_new_tokens=8, eos_ids=hf.eos_ids
        )
        ids, raw, _, _ = reference(hf.model, hf.tokenizer, p, grammar, 8, hf.eos_ids)
        assert g.token_ids == ids
        np.testing.assert_allclose(g.token_logprobs, raw, atol=BATCH_INVARIANCE_ATOL, rtol=0)


@pytest.mark.model
@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma-3-270m"])
def test_shared_prefix_on_the_embedded_models(name):
    # Gemma's sliding-window layers (512 tokens) are passed by the tool prompt: the prefix cache and
    # the forced runs must keep their window right too.
    hf = load_model(name, progress=False)
    context = "\nContext: " + "The library opens at nine and closes at five. " * 25
    (prompts, gens), counter = _check(hf, QUESTIONS[:3], 40, context)
    assert len(prompts[0]) > 512
    fed = sum(map(len, prompts)) + sum(len(g.token_ids) for g in gens)
    assert counter.tokens < fed - 512  # the third prompt's shared prefix was not encoded again
