"""Greedy decoding under a grammar (llguidance), with both the raw and the constrained log-probs.

At each step the grammar allows a set of tokens (llguidance's token mask); the greedy token is the
most likely *allowed* one. Two log-probs are kept for it:

- ``token_logprobs``: ``log p(token)`` under the model's own (raw) distribution: what G-NLL and every
  NLL gnll reports are computed from, and what a teacher-forced ``gnll score`` of the output gives;
- ``constrained_logprobs``: the same token renormalised over the allowed tokens,
  ``log p(token) - log sum_{allowed} p``: the distribution the grammar leaves (0 where the grammar
  forced the token).

**Canonical tokens.** A grammar lets any token whose bytes fit the grammar through, so greedy
decoding under it can spell a word with tokens the tokenizer would never produce (SmolLM2 wrote
``"calculator"`` as ``c`` + ``al`` + ``cul`` + ``ator`` after a forced quote, where the tokenizer
writes ``calcul`` + ``ator``). Such a path is out of the model's training distribution, and a
teacher-forced ``gnll score`` of the output's *text* re-tokenises it and gives another NLL (19.6
nats apart on that call). So each chosen token is checked with the one before it: when the two
are not how the tokenizer writes their bytes, the previous token is taken back (grammar matcher,
KV cache) and the bytes are decoded as the tokenizer writes them, their log-probs read at their
own positions. The greedy choice of *text* is kept; its tokens are the canonical ones, whose
NLL is what ``gnll score`` of the text gives. ``ConstrainedGeneration.canonical`` says whether the
whole output re-tokenises to its tokens (pairs being canonical is checked; the whole is verified).

llguidance is an optional dependency (``pip install gnll[structured]``).
"""

from __future__ import annotations

import copy
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


def _canonical_pair(llg: Any, prev: int, tok: int) -> list[int] | None:
    """``None`` when ``prev, tok`` is how the tokenizer writes their bytes; else how it does."""
    pair = [prev, tok]
    canon = list(llg.tokenize_bytes(llg.decode_bytes(pair)))
    return None if canon == pair else canon


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
    # a canonical rewind takes a token back (``crop``); a sliding-window layer (Gemma-3's 512) can
    # only do that once past its window if it keeps its past states
    cache.activate_past_recording()  # type: ignore[no-untyped-call]
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
    """Greedy decoding of ``prompt_ids`` under ``grammar`` (a Lark grammar; ``%json`` schemas), in
    the tokenizer's canonical tokens (the module).

    ``watch`` sees each token's text and raw log-prob once it is final (a token is final when the
    next one is chosen without taking it back, or when decoding ends); when it returns ``True``
    (an exact early decision: :mod:`gnll.toolwatch`) the output stops at that token, with finish
    reason ``"decided"``.

    A prompt prefix shared with the previous call is not encoded again (:func:`_prompt_cache`),
    and the prompt's positions get no logits (``logits_to_keep``)."""
    import llguidance
    import llguidance.torch as lt

    llg = _llg_tokenizer(tokenizer)
    matcher = llguidance.LLMatcher(llg, grammar)
    if matcher.is_error():
        raise ValueError(f"the grammar cannot be used: {matcher.get_error()}")
    mask = lt.allocate_token_bitmask(1, llg.vocab_size)
    cache, rest = _prompt_cache(model, prompt_ids)
    feed = torch.tensor([rest], dtype=torch.long, device=model.device)
    out_ids: list[int] = []
    raw: list[float] = []
    con: list[float] = []
    # per output token: the (raw log-probs, allowed log-probs) of the position it was chosen at,
    # so that a token taken back can be replaced from the same distribution
    states: list[tuple[torch.Tensor, torch.Tensor]] = []
    forced: list[int] = []  # canonical tokens that replace a non-canonical pair, in order
    rewinds = 0
    finish, terminator = "length", []
    state: tuple[torch.Tensor, torch.Tensor] | None = None

    watched = 0  # how many output tokens the watch has read

    def seen(k: int) -> bool:
        return watch is not None and watch(tokenizer.decode([out_ids[k]]), raw[k])

    while len(out_ids) < max_new_tokens:
        if state is None:
            logits = model(
                input_ids=feed, past_key_values=cache, use_cache=True, logits_to_keep=1
            ).logits[0, -1]
            logp = torch.log_softmax(logits.double(), dim=-1)
            lt.fill_next_token_bitmask(matcher, mask, 0)
            state = (logp, logp.masked_fill(~_unpacked(mask[0], logp.shape[0]), float("-inf")))
        logp, allowed = state
        was_forced = bool(forced)
        tok = forced.pop(0) if forced else int(torch.argmax(allowed))
        if not torch.isfinite(allowed[tok]):
            if not was_forced:
                raise ValueError("the grammar allows no token here")
            forced.clear()  # the grammar refuses the canonical spelling: keep the model's own
            tok = int(torch.argmax(allowed))
            was_forced = False
        if tok in eos_ids:
            finish, terminator = "stop", [tok]
            break
        canon = (
            _canonical_pair(llg, out_ids[-1], tok)
            if out_ids and not was_forced and rewinds < max_new_tokens
            else None
        )
        if canon is not None and torch.isfinite(states[-1][1][canon[0]]):
            # take the previous token back; decode the pair's bytes as the tokenizer writes them
            rewinds += 1
            matcher.rollback(1)
            out_ids.pop()
            raw.pop()
            con.pop()
            cache.crop(-1)  # the taken-back token's keys and values
            state = states.pop()
            forced = canon
            continue
        if not matcher.consume_token(tok):
            raise ValueError(f"the grammar refused its own token: {matcher.get_error()}")
        lp = float(logp[tok])
        norm = float(torch.logsumexp(allowed, dim=-1))
        out_ids.append(tok)
        raw.append(lp)
        con.append(min(0.0, lp - norm))
        states.append(state)
        state = None
        # the tokens before this one can no longer be taken back: the watch reads them now (once
        # each: a token taken back was never read)
        if watched < len(out_ids) - 1:
            watched += 1
            if seen(watched - 1):
                out_ids.pop()  # the output stops at the deciding token
                raw.pop()
                con.pop()
                finish = "decided"
                break
        if matcher.is_stopped():
            finish = "stop"
            break
        feed = torch.tensor([[tok]], dtype=torch.long, device=model.device)
    if finish != "decided" and watched < len(out_ids) and seen(len(out_ids) - 1):
        finish, terminator = "decided", []  # decided at the last token, before what ended it
    tokens = [tokenizer.decode([t]) for t in out_ids]
    canonical = list(llg.tokenize_bytes(llg.decode_bytes(out_ids))) == out_ids
    return ConstrainedGeneration(
        text=tokenizer.decode(out_ids),
        token_ids=out_ids,
        tokens=tokens,
        token_logprobs=raw,
        constrained_logprobs=con,
        finish_reason=finish,
        terminator_token_ids=terminator,
        canonical=canonical,
    )
