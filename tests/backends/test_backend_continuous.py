"""Continuous batching: prompts take the slots of finished rows, and no output changes.

Reference: the same model with ``continuous_batching=False`` (fixed batches, each decoded until its
last row ends) and teacher-forced scoring.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hf_helpers import FEW_SHOT, variant

from gnll import GenerationConfig
from gnll.backends.hf.decode import Decoder, refillable

pytestmark = pytest.mark.model

QUESTIONS = [
    "What is the capital of France?",
    "Which planet is known as the red planet?",
    "Who wrote the novel Moby-Dick, published in 1851, about a whale?",
    "What is two plus two?",
    "Name the longest river in Africa, which flows north into the Mediterranean Sea.",
    "In which year did the Second World War end?",
    "What is H2O?",
]
PROMPTS = [FEW_SHOT.format(q=q) for q in QUESTIONS]


class Shapes:
    """``(rows, new columns, mask columns)`` of every forward call of a model."""

    def __init__(self, module):
        self.calls: list[tuple[int, int, int]] = []
        self.handle = module.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
        self.calls.append((ids.shape[0], ids.shape[1], -1 if mask is None else mask.shape[1]))


def assert_same(a, b):
    for ga, gb in zip(a, b, strict=True):
        for x, y in zip(ga, gb, strict=True):
            assert x.token_ids == y.token_ids and x.text == y.text
            assert x.finish_reason == y.finish_reason
            assert x.terminator_token_ids == y.terminator_token_ids
            np.testing.assert_allclose(x.token_logprobs, y.token_logprobs, atol=1e-4)


def test_greedy_with_refills_equals_fixed_batches(smollm):
    cfg = GenerationConfig.greedy(max_new_tokens=24)
    cont = variant(smollm, batch_size=2)
    fixed = variant(smollm, batch_size=2, continuous_batching=False)
    shapes = Shapes(smollm.model)
    try:
        got = cont.generate(PROMPTS, cfg)
    finally:
        shapes.handle.remove()
    assert_same(got, fixed.generate(PROMPTS, cfg))
    # Prefills of joining prompts (several columns) happened between decoding steps, and every
    # decoding step ran 2 rows until the last prompts were admitted.
    steps = [rows for rows, cols, _ in shapes.calls if cols == 1]
    prefills = [rows for rows, cols, _ in shapes.calls if cols > 1]
    assert len(prefills) >= len(PROMPTS) // 2
    joined_at = max(i for i, (_, cols, _) in enumerate(shapes.calls) if cols > 1)
    before_last_join = [r for r, c, _ in shapes.calls[:joined_at] if c == 1]
    assert before_last_join and set(before_last_join) == {2}
    assert max(steps) == 2


def test_a_waiting_prompt_takes_a_finished_rows_slot(smollm):
    """A short and a long answer with a third prompt waiting: it joins when the short one ends,
    so every decoding step runs two rows until the queue is empty."""
    long = "Count from one to forty in words, separated by commas:"
    prompts = [PROMPTS[0], long, PROMPTS[3]]
    cfg = GenerationConfig.greedy(max_new_tokens=30, stop=("\n",))
    cont = variant(smollm, batch_size=2)
    shapes = Shapes(smollm.model)
    try:
        got = cont.generate(prompts, cfg)
    finally:
        shapes.handle.remove()
    steps = [rows for rows, cols, _ in shapes.calls if cols == 1]
    assert (
        steps.count(2) > len(got[1][0].token_ids) // 2
    )  # the long answer had a partner most steps
    assert_same(got, variant(smollm, continuous_batching=False).generate(prompts, cfg))


def test_sampling_with_refills_matches_teacher_forcing(smollm):
    cfg = GenerationConfig.sample(3, temperature=0.7, max_new_tokens=12, seed=11)
    gens = variant(smollm, batch_size=6).generate(PROMPTS[:4], cfg)
    for prompt, gs in zip(PROMPTS[:4], gens, strict=True):
        assert len(gs) == 3
        prompt_ids = smollm.encode([prompt])[0]
        for g in gs:
            full = g.token_ids + g.terminator_token_ids
            np.testing.assert_allclose(
                g.token_logprobs, smollm.score_tokens([prompt], [g.token_ids])[0], atol=1e-4
            )
            ids = torch.tensor([prompt_ids + full])
            with torch.inference_mode():
                logits = smollm.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
            tempered = torch.log_softmax(logits / 0.7, dim=-1)
            expect = tempered[torch.arange(len(g.token_ids)), torch.tensor(g.token_ids)].numpy()
            np.testing.assert_allclose(g.sampling_logprobs, expect, atol=1e-4)
    assert len({tuple(g.token_ids) for gs in gens for g in gs}) > 3, "samples should differ"


def test_a_longer_prompt_joining_widens_the_batch_and_old_columns_are_trimmed(smollm):
    """Prompts of any length can join (the serving case): a longer one pads the running rows on
    the left; columns no live row attends to are dropped, so the window stays bounded."""
    cfg = GenerationConfig.greedy(max_new_tokens=16)
    stops = smollm.stop_rules(cfg.stop)
    enc = smollm.encode(["Hi", PROMPTS[4], "What is H2O?", PROMPTS[2], "Say yes."])
    ref = variant(smollm, continuous_batching=False).generate(
        ["Hi", PROMPTS[4], "What is H2O?", PROMPTS[2], "Say yes."], cfg
    )
    dec = Decoder(smollm.engine, cfg, stops, width=2)
    shapes = Shapes(smollm.model)
    got: dict[int, list] = {}
    try:
        with torch.inference_mode():
            dec.add(0, enc[0])
            dec.add(2, enc[2])
            for _ in range(3):
                got.update(dec.step())
            for i in (1, 3, 4):  # arrive while the first two decode
                dec.add(i, enc[i])
            while dec.busy:
                got.update(dec.step())
    finally:
        shapes.handle.remove()
    assert sorted(got) == [0, 1, 2, 3, 4]
    assert_same([got[i] for i in range(5)], ref)
    longest = max(len(e) for e in enc)
    assert max(m for _, c, m in shapes.calls if c == 1) <= longest + cfg.max_new_tokens + 1


def test_tags_are_unique_and_beams_are_refused(smollm):
    cfg = GenerationConfig.greedy()
    dec = Decoder(smollm.engine, cfg, smollm.stop_rules(cfg.stop), width=2)
    dec.add("a", [1, 2, 3])
    with pytest.raises(ValueError, match="already decoding"):
        dec.add("a", [1, 2, 3])
    beams = GenerationConfig.beam(2)
    with pytest.raises(ValueError, match="not 'beam'"):
        Decoder(smollm.engine, beams, smollm.stop_rules(beams.stop), width=2)


def test_sliding_window_models_keep_fixed_batches(gemma, smollm):
    """Gemma's sliding-window layers count columns, so nothing joins a running batch there; the
    option changes no output."""
    assert refillable(smollm.engine) and not refillable(gemma.engine)
    cfg = GenerationConfig.greedy(max_new_tokens=12)
    got = variant(gemma, batch_size=2).generate(PROMPTS[:4], cfg)
    assert_same(
        got, variant(gemma, batch_size=2, continuous_batching=False).generate(PROMPTS[:4], cfg)
    )


def test_a_narrow_batch_grows_when_prompts_join(smollm):
    """A loop that opened with one prompt takes a second one into a new slot at the next step
    (a server's lone request, then another), instead of queueing it behind the first."""
    cfg = GenerationConfig.greedy(max_new_tokens=20, stop=())
    texts = ["Count from one to twenty: one, two,", "What is H2O?"]
    enc = smollm.encode(texts)
    ref = variant(smollm, continuous_batching=False).generate(texts, cfg)
    dec = smollm.open_decoder(cfg, width=4)
    got: dict[int, list] = {}
    dec.add(0, enc[0])
    got.update(dec.step())
    got.update(dec.step())
    dec.add(1, enc[1], max_new_tokens=6)
    got.update(dec.step())
    assert len(dec.slots.live()) == 2
    while dec.busy:
        got.update(dec.step())
    assert_same([got[0]], [ref[0]])
    [short] = got[1]
    assert short.token_ids == ref[1][0].token_ids[:6] and short.finish_reason == "length"


def arriving_one_by_one(model, questions):
    """Decode few-shot prompts that join the loop one per step, as a server's requests do; check
    the answers against fixed batches; the encoded prompts, the decoder and the prefill widths."""
    cfg = GenerationConfig.greedy(max_new_tokens=8)
    texts = [FEW_SHOT.format(q=q) for q in questions]
    enc = model.encode(texts)
    ref = variant(model, continuous_batching=False).generate(texts, cfg)
    dec = model.open_decoder(cfg, width=8)
    shapes = Shapes(model.model)
    got: dict[int, list] = {}
    try:
        for i, ids in enumerate(enc):
            dec.add(i, ids)
            got.update(dec.step())
        while dec.busy:
            got.update(dec.step())
    finally:
        shapes.handle.remove()
    assert_same([got[i] for i in range(len(texts))], ref)
    return enc, dec, [cols for _, cols, _ in shapes.calls if cols > 1]


def test_prompts_arriving_one_by_one_reuse_their_shared_prefix(smollm):
    """Prefix caching: a server's requests share a few-shot block; it runs through the model once
    (when the second request arrives) and later requests prefill only their own suffix."""
    enc, dec, prefills = arriving_one_by_one(smollm, QUESTIONS[:4])
    shortest = min(len(e) for e in enc)
    assert prefills[0] >= shortest  # the first request: the whole prompt
    # The second request computes the shared block once; every later one runs its suffix only.
    assert all(cols < shortest // 2 for cols in prefills[-2:]), prefills


def test_a_shorter_shared_head_is_cut_from_the_cached_prefix_not_rerun(smollm):
    """The first two requests share the few-shot block and their question's first words, so the
    cached prefix ends inside a question; a third request that shares only the block takes the
    prefix's head (causal keys and values are unchanged by what follows) without a forward pass."""
    questions = [
        "What is the capital of France?",
        "What is the capital of Italy?",
        "Which planet is known as the red planet?",
        "In which year did the Second World War end?",
    ]
    enc, dec, prefills = arriving_one_by_one(smollm, questions)
    long = min(len(e) for e in enc) // 2
    # The first request's whole prompt, then one shared-prefix pass; no second one for the third.
    assert [cols >= long for cols in prefills].count(True) == 2, prefills
    assert dec._prefix is not None and len(dec._prefix.ids) < len(os.path.commonprefix(enc[:2]))
