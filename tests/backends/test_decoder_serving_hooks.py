"""What `gnll serve` asks of the hf decoding loop besides answers: each answer token's most likely
alternatives (OpenAI's ``top_logprobs``), and dropping a prompt whose client went away."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gnll import GenerationConfig

pytestmark = pytest.mark.model

TEXTS = ["Count from one to twenty: one, two,", "What is H2O?"]


def test_top_logprobs_are_the_raw_distributions_most_likely_tokens(smollm):
    cfg = GenerationConfig.greedy(max_new_tokens=8, stop=())
    dec = smollm.open_decoder(cfg, width=2)
    dec.top_k = 3
    for i, ids in enumerate(smollm.encode(TEXTS)):
        dec.add(i, ids)
    got = {}
    while dec.busy:
        got.update(dec.step())
    for i in range(len(TEXTS)):
        [gen] = got[i]
        [alts] = dec.top_logprobs.pop(i)
        assert len(alts) == len(gen.token_ids)
        for tok, lp, top in zip(gen.tokens, gen.token_logprobs, alts, strict=True):
            values = list(top.values())
            assert 1 <= len(top) <= 3 and values == sorted(values, reverse=True)
            first, best = next(iter(top.items()))
            assert first == tok  # greedy: the chosen token is the most likely one
            assert best == pytest.approx(lp, abs=1e-5)  # the same raw log-prob  # same path: the top alternative is the chosen token's own log-prob, read from one row
            assert math.fsum(math.exp(v) for v in values) <= 1 + 1e-6
    assert dec.top_logprobs == {}


def test_a_cancelled_prompt_leaves_the_loop_and_the_others_are_unchanged(smollm):
    cfg = GenerationConfig.greedy(max_new_tokens=12, stop=())
    enc = smollm.encode(TEXTS)
    alone = smollm.open_decoder(cfg, width=2)
    alone.add(1, enc[1])
    ref = {}
    while alone.busy:
        ref.update(alone.step())
    dec = smollm.open_decoder(cfg, width=2)
    dec.add(0, enc[0])
    dec.add(1, enc[1])
    got = dec.step()
    dec.cancel(0)
    assert len(dec.slots.live()) == 1  # the slot is free at once
    steps = 1
    while dec.busy:
        got += dec.step()
        steps += 1
    assert [tag for tag, _ in got] == [1]
    assert got[0][1][0].token_ids == ref[1][0].token_ids
    np.testing.assert_allclose(got[0][1][0].token_logprobs, ref[1][0].token_logprobs, atol=1e-4)
    assert 0 not in dec.results
