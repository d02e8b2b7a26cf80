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

import copy
import math
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


#: Shortest shared prompt prefix worth keeping the KV cache of: below it, re-encoding costs little.
MIN_SHARED_PREFIX = 64


def _prompt_cache(model: Any, prompt_ids: Sequence[int]) -> tuple[DynamicCache, list[int]]:
    """A KV cache already holding a prefix of ``prompt_ids``, and the prompt tokens still to feed.

    Requests under a grammar share long prompt prefixes (every tool call carries the same tool
    prompt, hundreds of tokens, before a short question), and encoding them is most of a call's
    cost on a CPU. The model keeps one snapshot (``_gnll_prompt_prefix``): the last prompt and the
    cache of the prefix it shares with the prompt before it. A prompt starting with that prefix
    starts from a copy of the snapshot (never the snapshot itself: decoding appends to its cache).
    """
    ids = tuple(prompt_ids)
    last, prefix, snapshot = getattr(model, "_gnll_prompt_prefix", ((), (), None))
    if snapshot is not None and len(prefix) < len(ids) and ids[: len(prefix)] == prefix:
        model._gnll_prompt_prefix = (ids, prefix, snapshot)
        return copy.deepcopy(snapshot), list(ids[len(prefix) :])
    shared = 0
    for a, b in zip(last, ids[:-1], strict=False):  # at least one token left to feed
        if a != b:
            break
        shared += 1
    cache = DynamicCache(config=model.config)
    if shared < MIN_SHARED_PREFIX:
        model._gnll_prompt_prefix = (ids, prefix, snapshot)
        return cache, list(ids)
    head = torch.tensor([list(ids[:shared])], dtype=torch.long, device=model.device)
    model(input_ids=head, past_key_values=cache, use_cache=True, logits_to_keep=1)
    model._gnll_prompt_prefix = (ids, ids[:shared], copy.deepcopy(cache))
    return cache, list(ids[shared:])


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
    ``"decided"``.

    Where the grammar allows exactly one token (the tags, the JSON punctuation and keys of a call:
    most of its tokens), that token is the greedy choice whatever the logits, so a run of them is
    fed in one forward pass with the token chosen before it; their log-probs are read from that
    pass's rows. Same tokens and log-probs as one pass per token, a fraction of the passes. A
    prompt prefix shared with the previous call is not encoded again (:func:`_prompt_cache`).
    """
    import llguidance
    import llguidance.torch as lt

    llg = _llg_tokenizer(tokenizer)
    matcher = llguidance.LLMatcher(llg, grammar)
    if matcher.is_error():
        raise ValueError(f"the grammar cannot be used: {matcher.get_error()}")
    mask = lt.allocate_token_bitmask(1, llg.vocab_size)
    cache, feed = _prompt_cache(model, prompt_ids)
    out_ids: list[int] = []
    raw: list[float] = []
    con: list[float] = []
    finish, terminator = "length", []

    def allowed_now(vocab: int) -> torch.Tensor:
        lt.fill_next_token_bitmask(matcher, mask, 0)
        return _unpacked(mask[0], vocab)

    def forced_run(vocab: int) -> list[int]:
        """The tokens the grammar forces from here on (consumed), up to the token budget."""
        run: list[int] = []
        while len(out_ids) + len(run) < max_new_tokens and not matcher.is_stopped():
            allowed = allowed_now(vocab)
            if int(allowed.sum()) != 1:
                break
            tok = int(torch.argmax(allowed.to(torch.uint8)))
            if tok in eos_ids:  # the end is decided where every other choice is: below
                break
            if not matcher.consume_token(tok):
                raise ValueError(f"the grammar refused its own token: {matcher.get_error()}")
            run.append(tok)
        return run

    vocab = int(model.get_output_embeddings().weight.shape[0])
    forced = forced_run(vocab)
    while True:
        ids = torch.tensor([feed + forced], dtype=torch.long, device=model.device)
        logits = model(
            input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=len(forced) + 1
        ).logits[0]
        logp_rows = torch.log_softmax(logits.double(), dim=-1)
        for row, tok in zip(logp_rows, forced, strict=False):
            lp = float(row[tok])
            if not math.isfinite(lp):
                raise ValueError("the grammar allows no token here")
            out_ids.append(tok)
            raw.append(lp)
            con.append(0.0)  # the only allowed token: probability 1 under the grammar
            if watch is not None and watch(tokenizer.decode([tok]), lp):
                finish = "decided"
                break
        if finish == "decided":
            break
        if matcher.is_stopped():
            finish = "stop"
            break
        if len(out_ids) >= max_new_tokens:
            break
        logp = logp_rows[-1]
        allowed = logp.masked_fill(~allowed_now(logp.shape[0]), float("-inf"))
        tok = int(torch.argmax(allowed))
        if not torch.isfinite(allowed[tok]):
            raise ValueError("the grammar allows no token here")
        lp = float(logp[tok])
        norm = float(torch.logsumexp(allowed, dim=-1))
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
        if len(out_ids) >= max_new_tokens:
            break
        feed, forced = [tok], forced_run(vocab)
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
