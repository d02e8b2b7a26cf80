"""Beam search in gnll's loop gives transformers' beams; done prompts leave the batch; progress hooks.

Reference: the same model with ``beam_decoder="generate"`` (transformers' beam search fed with the
loop's prefill, then teacher-forced scoring), and with ``decoder="generate"`` (plain padded prompts).
"""

from __future__ import annotations

import numpy as np
import pytest
from hf_helpers import QUESTIONS, few_shot

from gnll import GenerationConfig
from gnll.backends.base import BATCH_INVARIANCE_ATOL

pytestmark = pytest.mark.model

PROMPTS = few_shot(QUESTIONS)


def assert_same_beams(fast, ref):
    for fs, rs in zip(fast, ref, strict=True):
        assert [g.token_ids for g in fs] == [g.token_ids for g in rs]
        assert [g.finish_reason for g in fs] == [g.finish_reason for g in rs]
        for a, b in zip(fs, rs, strict=True):
            np.testing.assert_allclose(
                a.token_logprobs, b.token_logprobs, atol=BATCH_INVARIANCE_ATOL
            )
            np.testing.assert_allclose(
                a.terminator_logprobs, b.terminator_logprobs, atol=BATCH_INVARIANCE_ATOL
            )


@pytest.mark.parametrize("k", [2, 5])
def test_loop_beams_equal_transformers_beams(smollm, smollm_generate_beams, k):
    assert smollm.own_beam_search
    cfg = GenerationConfig.beam(k, max_new_tokens=20)
    fast = smollm.generate(PROMPTS, cfg)
    ref = smollm_generate_beams.generate(PROMPTS, cfg)
    assert all(len(bs) == k for bs in fast)
    assert_same_beams(fast, ref)


def test_loop_beams_equal_plain_generate_beams_on_chat_prompts(smollm, smollm_generate):
    # Chat-template prompts, no shared prefix trick on the reference side, a length cut-off.
    cfg = GenerationConfig.beam(3, max_new_tokens=6)
    fast = smollm.generate(QUESTIONS[:3], cfg)
    ref = smollm_generate.generate(QUESTIONS[:3], cfg)
    assert any(g.finish_reason == "length" for bs in fast for g in bs)
    assert_same_beams(fast, ref)


def test_loop_beams_on_a_sliding_window_model(gemma, gemma_generate_beams):
    cfg = GenerationConfig.beam(4, max_new_tokens=12)
    fast = gemma.generate(PROMPTS[:4], cfg)
    ref = gemma_generate_beams.generate(PROMPTS[:4], cfg)
    assert_same_beams(fast, ref)


def test_done_prompts_leave_the_batch(smollm):
    shapes: list[tuple[int, int]] = []
    handle = smollm.model.register_forward_pre_hook(
        lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        smollm.generate(PROMPTS, GenerationConfig.beam(3, max_new_tokens=30))
    finally:
        handle.remove()
    steps = [r for r, c in shapes if c == 1]  # decoding steps (prefill forwards are wider)
    # Short answers end early: later steps run fewer prompts' beams than the first.
    assert steps[0] == 3 * len(PROMPTS) and min(steps) < steps[0]
    assert all(r % 3 == 0 for r in steps)


@pytest.mark.parametrize(
    "cfg",
    [
        GenerationConfig.greedy(max_new_tokens=12),
        GenerationConfig.sample(3, temperature=1.0, seed=0, max_new_tokens=12),
        GenerationConfig.beam(3, max_new_tokens=12),
    ],
    ids=["greedy", "sample", "beam"],
)
def test_progress_callback_counts_every_prompt_as_it_finishes(smollm, cfg):
    calls: list[float] = []
    smollm.generate(PROMPTS, cfg, batch_size=9, progress=calls.append)
    assert sum(calls) == pytest.approx(len(PROMPTS))
    assert len(calls) > 1 and all(c > 0 for c in calls)
