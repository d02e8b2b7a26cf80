"""Greedy decoding under a grammar is in the tokenizer's canonical tokens (fast tier: the tiny
byte-level BPE tokenizer and a stand-in model whose logits prefer the shortest tokens, the worst
case: every word would be spelled byte by byte, which the tokenizer never does)."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("llguidance")
from transformers import AutoTokenizer, LlamaConfig  # noqa: E402

from gnll.backends.hf.constrained import _llg_tokenizer, generate_constrained  # noqa: E402
from gnll.toolcalls import call_grammar  # noqa: E402

PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Lyon"]}},
    "required": ["city"],
}
#: Two functions, so the name is the model's choice (llguidance forces what the grammar leaves no
#: choice about in canonical tokens, but from where the forcing starts: after a free "c", SmolLM2
#: got "al" + "cul" + "ator" forced)
FUNCTIONS = [
    {"name": "get_weather", "parameters": PARAMETERS},
    {"name": "calculator", "parameters": PARAMETERS},
]


class ShortestTokens:
    """Logits that prefer a token the fewer bytes it has (the same at every position)."""

    def __init__(self, tok) -> None:
        llg = _llg_tokenizer(tok)
        n = llg.vocab_size
        lengths = torch.tensor([len(llg.decode_bytes([i])) for i in range(n)], dtype=torch.float64)
        self.logits = -2.0 * lengths
        self.logits[tok.eos_token_id] = -100.0
        self.config = LlamaConfig(
            vocab_size=n,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
        self.device = torch.device("cpu")

    def __call__(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep=0):
        return SimpleNamespace(logits=self.logits.expand(1, input_ids.shape[1], -1))


@pytest.fixture(scope="module")
def tok(tiny_llama):
    """The tiny checkpoint's byte-level BPE tokenizer (tests/conftest.py)."""
    return AutoTokenizer.from_pretrained(tiny_llama())


def test_the_grammars_greedy_output_is_in_canonical_tokens_with_their_log_probs(tok):
    model = ShortestTokens(tok)
    prompt = tok("Weather in Paris?", add_special_tokens=False)["input_ids"]
    gen = generate_constrained(
        model,
        tok,
        prompt,
        call_grammar(FUNCTIONS),
        max_new_tokens=200,
        eos_ids={tok.eos_token_id},
    )
    assert gen.finish_reason == "stop" and gen.text.startswith("<tool_call>\n{")
    canonical = tok(gen.text, add_special_tokens=False)["input_ids"]
    # byte by byte would be len(gen.text) tokens; the tokenizer writes the text in fewer
    assert len(canonical) < len(gen.text)
    assert gen.token_ids == canonical and gen.canonical is True
    # each token's raw log-prob is the model's at its position (the same at every position here)
    logp = torch.log_softmax(model.logits, dim=-1)
    assert gen.token_logprobs == [float(logp[t]) for t in gen.token_ids]  # same path: these very log-probs
    assert all(c <= 0.0 for c in gen.constrained_logprobs)


def test_an_early_decision_watch_reads_each_final_token_once(tok):
    """A token taken back (to decode its pair canonically) is not read by the watch: it reads the
    output's tokens once each, in order, and a decision stops the output at its token."""
    model = ShortestTokens(tok)
    prompt = tok("Weather in Paris?", add_special_tokens=False)["input_ids"]
    grammar = call_grammar(FUNCTIONS)
    decode = partial(
        generate_constrained,
        model,
        tok,
        prompt,
        grammar,
        max_new_tokens=200,
        eos_ids={tok.eos_token_id},
    )
    read: list[str] = []
    full = decode(watch=lambda t, lp: read.append(t) or False)
    assert read == full.tokens and full.finish_reason == "stop"
    at = full.tokens.index("ator")  # after the rewinds of the function's name
    seen: list[str] = []
    cut = decode(watch=lambda t, lp: seen.append(t) or len(seen) == at + 1)
    assert cut.finish_reason == "decided" and cut.tokens == full.tokens[: at + 1] == seen
    assert cut.token_logprobs == full.token_logprobs[: at + 1]  # same path: the same decode


class SlidingWindowShortestTokens(ShortestTokens):
    """The same logits, over a Gemma-3-like cache whose first layer keeps a sliding window of 4
    tokens: each call writes its tokens' keys and values into the cache as a model does."""

    def __init__(self, tok) -> None:
        super().__init__(tok)
        from transformers import Gemma3TextConfig

        self.config = Gemma3TextConfig(
            vocab_size=self.logits.shape[0],
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            sliding_window=4,
            layer_types=["sliding_attention", "full_attention"],
        )

    def __call__(self, input_ids, past_key_values=None, use_cache=True, logits_to_keep=0):
        states = torch.zeros(1, 1, input_ids.shape[1], 8)
        for layer in range(2):
            past_key_values.update(states, states, layer)
        return super().__call__(input_ids, past_key_values, use_cache, logits_to_keep)


def test_a_token_is_taken_back_past_a_sliding_window(tok):
    """Gemma-3's sliding-window layers drop states that leave the window; the canonical rewind
    takes a token back long after the prompt has passed it (a tool prompt is ~530 tokens, the
    window 512), which raised in transformers' cache before."""
    model = SlidingWindowShortestTokens(tok)
    prompt = tok("Weather in Paris? " * 4, add_special_tokens=False)["input_ids"]
    assert len(prompt) > model.config.sliding_window
    gen = generate_constrained(
        model, tok, prompt, call_grammar(FUNCTIONS), max_new_tokens=200, eos_ids={tok.eos_token_id}
    )
    assert gen.finish_reason == "stop"
    assert gen.token_ids == tok(gen.text, add_special_tokens=False)["input_ids"]
