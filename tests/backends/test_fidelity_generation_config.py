"""A checkpoint's own generation_config (sampling, top-k, repetition penalty) must not leak in."""

from __future__ import annotations

import numpy as np
import pytest

from gnll import GenerationConfig, load_model
from gnll.backends.base import BATCH_INVARIANCE_ATOL

PROMPTS = [
    "Question: What is the capital of France?\nAnswer:",
    "Question: Who wrote Hamlet?\nAnswer:",
]


@pytest.fixture(scope="module")
def checkpoints(tiny_llama):
    """The same tiny random Llama twice: plain, and with a generation config that samples."""
    sampling = {
        "do_sample": True,
        "top_k": 5,
        "temperature": 3.0,
        "repetition_penalty": 2.0,
        "no_repeat_ngram_size": 2,
    }
    return {
        "plain": str(tiny_llama(max_position_embeddings=512, generation_config={})),
        "sampling": str(tiny_llama(max_position_embeddings=512, generation_config=sampling)),
    }


def _load(path, decoder):
    return load_model(
        path, progress=False, device="cpu", dtype="float32", chat_template=False, decoder=decoder
    )


@pytest.mark.parametrize("decoder", ["generate", "auto"])
def test_checkpoint_generation_config_is_ignored(checkpoints, decoder):
    plain, sampling = _load(checkpoints["plain"], decoder), _load(checkpoints["sampling"], decoder)
    assert sampling.info()["ignored_generation_config"]["do_sample"] is True
    assert sampling.info()["ignored_generation_config"]["repetition_penalty"] == 2.0
    assert plain.info()["ignored_generation_config"] == {}
    for cfg in (
        GenerationConfig.greedy(max_new_tokens=12, stop=()),
        GenerationConfig.beam(3, max_new_tokens=8, stop=()),
        GenerationConfig.sample(3, temperature=0.7, max_new_tokens=8, stop=(), seed=1),
    ):
        a = plain.generate(PROMPTS, cfg)
        b = sampling.generate(PROMPTS, cfg)
        for ga, gb in zip(a, b, strict=True):
            assert [g.token_ids for g in ga] == [g.token_ids for g in gb], cfg.strategy
            for x, y in zip(ga, gb, strict=True):
                np.testing.assert_allclose(
                    x.token_logprobs, y.token_logprobs, atol=BATCH_INVARIANCE_ATOL
                )
    # and the greedy log-probs are the raw model's (teacher-forced scoring agrees)
    [[g]] = sampling.generate(PROMPTS[:1], GenerationConfig.greedy(max_new_tokens=10, stop=()))
    [scored] = sampling.score(PROMPTS[:1], [g.text], raw_prompt=True)
    if scored.token_ids == g.token_ids:
        np.testing.assert_allclose(scored.token_logprobs, g.token_logprobs, atol=1e-4)
