"""Greedy decoding under a grammar: the batched path (grammar-forced runs in one forward pass, a
shared prompt prefix encoded once) gives the tokens and log-probs of one forward pass per token.

The reference below is the decoding loop as it was (every token its own pass, every prompt encoded
whole); the two paths are compared at the documented cross-path tolerance."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from gnll import load_model
from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.backends.hf import constrained
from gnll.toolcalls import call_grammar, tool_system_prompt

pytest.importorskip("llguidance")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up the encyclopedia article whose title answers the question",
            "parameters": {
                "type": "object",
                "properties": {"title": {"type": "string"}},
                "required": ["title"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Compute a op b for two numbers",
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": "number"},
                    "op": {"type": "string", "enum": ["+", "-", "*", "/"]},
                    "b": {"type": "number"},
                },
                "required": ["a", "op", "b"],
            },
        },
    },
]


@torch.inference_mode()
def reference(
    model: Any, tokenizer: Any, prompt_ids: list[int], grammar: str, n: int, eos: set[int]
):
    """One forward pass per token, the whole prompt encoded (the loop before the batched path)."""
    import llguidance
    import llguidance.torch as lt

    llg = constrained._llg_tokenizer(tokenizer)
    matcher = llguidance.LLMatcher(llg, grammar)
    mask = lt.allocate_token_bitmask(1, llg.vocab_size)
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([prompt_ids])
    out, raw, con, finish = [], [], [], "length"
    for _ in range(n):
        logp = torch.log_softmax(
            model(input_ids=ids, past_key_values=cache).logits[0, -1].double(), -1
        )
        lt.fill_next_token_bitmask(matcher, mask, 0)
        allowed = logp.masked_fill(~constrained._unpacked(mask[0], logp.shape[0]), float("-inf"))
        tok = int(torch.argmax(allowed))
        if tok in eos:
            finish = "stop"
            break
        assert matcher.consume_token(tok)
        out.append(tok)
        raw.append(float(logp[tok]))
        con.append(min(0.0, float(logp[tok] - torch.logsumexp(allowed, -1))))
        if matcher.is_stopped():
            finish = "stop"
            break
        ids = torch.tensor([[tok]])
    return out, raw, con, finish


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


def test_batched_path_gives_the_reference_tokens_and_logprobs_in_fewer_passes(tiny_llama):
    hf = load_model(str(tiny_llama(max_position_embeddings=2048)), progress=False, device="cpu")
    (prompts, gens), counter = _check(hf, QUESTIONS, 48)
    produced = sum(len(g.token_ids) for g in gens)
    # grammar-forced runs share a pass: fewer passes than tokens (the old loop: one per token, and
    # the random model's free-text values take many tokens)
    assert counter.passes < produced
    # the tool prompt is encoded for the first two prompts (the second stores the shared prefix),
    # not for the third
    shared = 0
    while prompts[1][shared] == prompts[2][shared]:
        shared += 1
    assert shared >= constrained.MIN_SHARED_PREFIX
    assert counter.tokens < sum(map(len, prompts)) + produced - shared


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


def test_a_watch_stops_the_batched_path_at_the_token_the_reference_stops_at(tiny_llama):
    # a decision at a grammar-forced token (inside a run fed in one pass) and at a chosen one
    hf = load_model(str(tiny_llama(max_position_embeddings=2048)), progress=False, device="cpu")
    grammar = call_grammar([t["function"] for t in TOOLS])
    [prompt] = hf.encode([tool_system_prompt(TOOLS) + "\nQ: 2+2?\nA:"], raw_prompt=True)
    ids, raw, _, _ = reference(hf.model, hf.tokenizer, prompt, grammar, 30, hf.eos_ids)
    for k in (3, 9, 17, 24):
        seen: list[tuple[str, float]] = []

        def watch(text: str, lp: float, seen: list[tuple[str, float]] = seen, k: int = k) -> bool:
            seen.append((text, lp))
            return len(seen) == k

        g = constrained.generate_constrained(
            hf.model,
            hf.tokenizer,
            prompt,
            grammar,
            max_new_tokens=30,
            eos_ids=hf.eos_ids,
            watch=watch,
        )
        assert g.finish_reason == "decided" and g.token_ids == ids[:k]
        assert [t for t, _ in seen] == [hf.tokenizer.decode([t]) for t in ids[:k]]
        np.testing.assert_allclose(
            [lp for _, lp in seen], raw[:k], atol=BATCH_INVARIANCE_ATOL, rtol=0
        )


@pytest.mark.model
@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma-3-270m"])
def test_batched_path_on_the_embedded_models(name):
    # Gemma's sliding-window layers (512 tokens) are passed by the tool prompt: the prefix cache and
    # the forced runs must keep their window right too.
    hf = load_model(name, progress=False)
    context = "\nContext: " + "The library opens at nine and closes at five. " * 25
    (prompts, gens), counter = _check(hf, QUESTIONS[:2], 40, context)
    assert len(prompts[0]) > 512
    assert counter.passes < sum(len(g.token_ids) for g in gens)
