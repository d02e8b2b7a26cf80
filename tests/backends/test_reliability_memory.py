"""Issue 15, point 6: bounded memory in the hf backend.

The KV cache grows as needed (no max_new_tokens reserve per row), teacher-forced scoring never
holds more than a bounded rows x positions x vocabulary logits tensor (long continuations are
scored in pieces), prompts longer than the context are a clear error, and a batch that runs out of
memory is retried in halves.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnll.backends.base import GenerationConfig
from gnll.backends.hf import kv_cache, scoring

pytestmark = pytest.mark.model


def _record_capacity(monkeypatch) -> list[int]:
    seen: list[int] = []
    allocate, update = kv_cache.GrowingLayer.allocate, kv_cache.GrowingLayer.update

    def rec_allocate(self, *a, **k):
        allocate(self, *a, **k)
        seen.append(self._kbuf.shape[0] * self._kbuf.shape[-2])

    def rec_update(self, *a, **k):
        out = update(self, *a, **k)
        seen.append(self._kbuf.shape[0] * self._kbuf.shape[-2])
        return out

    monkeypatch.setattr(kv_cache.GrowingLayer, "allocate", rec_allocate)
    monkeypatch.setattr(kv_cache.GrowingLayer, "update", rec_update)
    return seen


def test_kv_cache_grows_instead_of_reserving_max_new_tokens(smollm, monkeypatch):
    seen = _record_capacity(monkeypatch)
    prompt = ["What is the capital of France?"]
    [[gen]] = smollm.generate(prompt, GenerationConfig.greedy(max_new_tokens=3000))
    assert gen.finish_reason == "eos" and len(gen.token_ids) < 50  # a short answer
    assert seen, "the growing cache was not used"
    prompt_len = len(smollm.encode(prompt)[0])
    # prompt + answer + at most 64 reserved (+ 50 % growth), never 3000 positions
    assert max(seen) <= int(1.5 * (prompt_len + len(gen.token_ids) + 64)) + 64, max(seen)


def test_prompt_longer_than_the_context_is_a_clear_error(smollm):
    context = smollm.model.config.max_position_embeddings
    long_prompt = "word " * (context + 10)
    with pytest.raises(ValueError, match=f"context of {context} tokens"):
        smollm.generate([long_prompt], GenerationConfig.greedy(max_new_tokens=4))
    short = "What is 2 + 2?"
    n = len(smollm.encode([short])[0])
    with pytest.raises(ValueError, match="lower max_new_tokens"):
        smollm.generate([short], GenerationConfig.greedy(max_new_tokens=context - n + 1))
    with pytest.raises(ValueError, match="context"):
        smollm.score_tokens([short], [[42] * context])


def test_out_of_memory_batch_is_retried_in_halves(smollm, monkeypatch):
    import gnll.backends.hf.model as hf

    prompts = [f"What is {k} plus {k}?" for k in range(3)]
    cfg = GenerationConfig.greedy(max_new_tokens=8)
    alone = [smollm.generate([p], cfg)[0] for p in prompts]
    real, sizes = hf.decode, []

    def tight(engine, rows, *a, **k):
        sizes.append(len(rows))
        if len(rows) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")
        return real(engine, rows, *a, **k)

    monkeypatch.setattr(hf, "decode", tight)
    got = smollm.generate(prompts, cfg, batch_size=4)
    assert sizes[0] == 3 and sizes.count(1) == 3
    assert [g[0].text for g in got] == [g[0].text for g in alone]
    monkeypatch.setattr(hf, "decode", lambda *a, **k: (_ for _ in ()).throw(MemoryError()))
    with pytest.raises(MemoryError):  # a single prompt that does not fit is not retried forever
        smollm.generate(prompts[:1], cfg)


def test_long_continuations_are_scored_in_bounded_pieces(smollm, monkeypatch):
    prompt = "Count: one two three"
    cont = smollm.encode([" four five six seven eight nine ten eleven twelve thirteen fourteen"])[0]
    cont = cont[-20:]
    whole = smollm.score_tokens([prompt], [cont])[0]
    vocab = smollm.model.config.vocab_size
    # 32 positions of KV cache hold 7.5 positions of logits: pieces of 6 tokens (+1 for the next)
    monkeypatch.setattr(smollm, "max_batch_tokens", 32)
    bound = scoring.max_logits_elements(smollm.model.config, 32)
    assert bound // vocab == 7
    kept: list[int] = []
    prefill = smollm.engine.prefill

    def rec(rows, prefix, **kw):
        kept.append(len(rows) * kw.get("keep", 1))
        return prefill(rows, prefix, **kw)

    monkeypatch.setattr(smollm.engine, "prefill", rec)
    pieces = smollm.score_tokens([prompt], [cont])[0]
    assert kept and max(kept) <= 7  # never more than the bound's positions of logits at once
    assert len(kept) >= 3  # 20 tokens in pieces of at most 6
    assert len(pieces) == len(cont)
    np.testing.assert_allclose(pieces, whole, atol=1e-3)


def test_scoring_logits_follow_max_batch_tokens(smollm, monkeypatch):
    """The logits of a scoring batch stay within the KV-cache size of ``max_batch_tokens``."""
    vocab = smollm.model.config.vocab_size
    prompts = [f"Question {k}: what is {k} times {k}? Answer:" for k in range(12)]
    answers = [f" {k * k} is the product of {k} and {k}" for k in range(12)]
    reference = smollm.score(prompts, answers)
    prefill = smollm.engine.prefill
    peaks = {}
    for budget in (256, 1024):
        monkeypatch.setattr(smollm, "max_batch_tokens", budget)
        logits: list[int] = []

        def rec(rows, prefix, _seen=logits, **kw):
            out = prefill(rows, prefix, **kw)
            _seen.append(out.logits.numel())
            return out

        monkeypatch.setattr(smollm.engine, "prefill", rec)
        got = smollm.score(prompts, answers)
        bound = scoring.max_logits_elements(smollm.model.config, budget)
        assert max(logits) <= bound, (budget, max(logits), bound)
        peaks[budget] = max(logits)
        for r, g in zip(reference, got, strict=True):
            np.testing.assert_allclose(g.token_logprobs, r.token_logprobs, atol=1e-4)
            assert g.is_greedy == r.is_greedy
    assert peaks[256] < peaks[1024] and peaks[256] // vocab >= 1


def test_scoring_respects_max_batch_tokens(smollm, monkeypatch):
    monkeypatch.setattr(smollm, "max_batch_tokens", 64)
    seen: list[int] = []
    prefill = smollm.engine.prefill

    def rec(rows, prefix, **kw):
        seen.append(len(rows) * max(len(r) for r in rows))
        return prefill(rows, prefix, **kw)

    monkeypatch.setattr(smollm.engine, "prefill", rec)
    prompts = [f"Question {k}: what is {k} times {k}?" for k in range(6)]
    smollm.score_tokens(prompts, [[28, 29, 30]] * 6)
    assert len(seen) > 1 and max(seen) <= 64
