"""Greedy decoding under a grammar (llguidance), with both the raw and the constrained log-probs.

At each step the grammar allows a set of tokens (llguidance's token mask); the greedy token is the
most likely *allowed* one. Two log-probs are kept for it:

- ``token_logprobs``: ``log p(token)`` under the model's own (raw) distribution: what G-NLL and every
  NLL gnll reports are computed from, and what a teacher-forced ``gnll score`` of the output gives;
- ``constrained_logprobs``: the same token renormalised over the allowed tokens,
  ``log p(token) - log sum_{allowed} p``: the distribution the grammar leaves (0 where the grammar
  forced the token).

llguidance is an optional dependency (``pip install gnll[structured]``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import DynamicCache

from gnll.backends.constrained import ConstrainedGeneration


def _llg_tokenizer(tokenizer: Any) -> Any:
    cached = getattr(tokenizer, "_gnll_llg", None)
    if cached is None:
        import llguidance.hf

        cached = llguidance.hf.from_tokenizer(tokenizer)
        tokenizer._gnll_llg = cached
    return cached


_BITS = torch.arange(32, dtype=torch.int32)


def _unpacked(mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """llguidance's packed int32 token bitmask as booleans over ``vocab`` logits (rows past the
    tokenizer's vocabulary, padding of the embedding, are never allowed). Unpacked here rather than
    with llguidance's torch kernel, which compiles itself with ``torch.compile`` on first use."""
    bits = ((mask[:, None] >> _BITS) & 1).bool().flatten()
    out = torch.zeros(vocab, dtype=torch.bool)
    n = min(vocab, bits.shape[0])
    out[:n] = bits[:n]
    return out


@torch.inference_mode()
def generate_constrained(
    model: Any,
    tokenizer: Any,
    prompt_ids: Sequence[int],
    grammar: str,
    *,
    max_new_tokens: int,
    eos_ids: set[int],
    watch: Callable[[str, float], bool] | None = None,
) -> ConstrainedGeneration:
    """Greedy decoding of ``prompt_ids`` under ``grammar`` (a Lark grammar; ``%json`` schemas).

    ``watch`` sees each token's text and raw log-prob as it is decoded; when it returns ``True``
    (an exact early decision: :mod:`gnll.toolwatch`) decoding stops there, with finish reason
    ``"decided"``."""
    import llguidance
    import llguidance.torch as lt

    llg = _llg_tokenizer(tokenizer)
    matcher = llguidance.LLMatcher(llg, grammar)
    if matcher.is_error():
        raise ValueError(f"the grammar cannot be used: {matcher.get_error()}")
    mask = lt.allocate_token_bitmask(1, llg.vocab_size)
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=model.device)
    out_ids: list[int] = []
    raw: list[float] = []
    con: list[float] = []
    finish, terminator = "length", []
    for _ in range(max_new_tokens):
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[0, -1]
        logp = torch.log_softmax(logits.double(), dim=-1)
        lt.fill_next_token_bitmask(matcher, mask, 0)
        allowed = logp.masked_fill(~_unpacked(mask[0], logp.shape[0]), float("-inf"))[None, :]
        tok = int(torch.argmax(allowed[0]))
        if not torch.isfinite(allowed[0, tok]):
            raise ValueError("the grammar allows no token here")
        lp = float(logp[tok])
        norm = float(torch.logsumexp(allowed[0], dim=-1))
        if tok in eos_ids:
            finish, terminator = "stop", [tok]
            break
        if not matcher.consume_token(tok):
            raise ValueError(f"the grammar refused its own token: {matcher.get_error()}")
        out_ids.append(tok)
        raw.append(lp)
        con.append(min(0.0, lp - norm))
        if watch is not None and watch(tokenizer.decode([tok]), lp):
            finish = "decided"
            break
        if matcher.is_stopped():
            finish = "stop"
            break
        ids = torch.tensor([[tok]], dtype=torch.long, device=model.device)
    tokens = [tokenizer.decode([t]) for t in out_ids]
    return ConstrainedGeneration(
        text=tokenizer.decode(out_ids),
        token_ids=out_ids,
        tokens=tokens,
        token_logprobs=raw,
        constrained_logprobs=con,
        finish_reason=finish,
        terminator_token_ids=terminator,
    )
