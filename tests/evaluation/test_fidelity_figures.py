"""A real model's next-token distributions along the greedy answer (the counterpart of the paper's
Fig. 3), on a tiny local checkpoint."""

from __future__ import annotations

import math

import pytest

from gnll import GenerationConfig, load_model
from gnll.evaluation.figures.next_tokens import next_token_distributions, plot_next_tokens

PROMPTS = [
    "Question: What is the capital of France?\nAnswer:",
    "Question: Who wrote Hamlet?\nAnswer:",
]


def test_greedy_token_is_the_top_of_each_step_and_its_probability_matches(
    tiny_llama,
    tmp_path,
):
    model = load_model(
        str(tiny_llama(max_position_embeddings=1024)),
        progress=False,
        device="cpu",
        dtype="float32",
        chat_template=False,
    )
    data = next_token_distributions(model, PROMPTS, k=5, max_new_tokens=6)
    gens = model.generate(PROMPTS, GenerationConfig.greedy(max_new_tokens=6))
    for d, (g,) in zip(data, gens, strict=True):
        assert len(d["steps"]) == len(g.token_ids) and d["answer"] == g.text
        assert d["g_nll"] == pytest.approx(-sum(g.token_logprobs))
        for step, lp in zip(d["steps"], g.token_logprobs, strict=True):
            probs = [p for _, p in step["top"]]
            assert probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-6
            assert step["greedy_prob"] == pytest.approx(probs[0], rel=1e-4)
            assert step["greedy_prob"] == pytest.approx(math.exp(lp), rel=1e-3)
    out = plot_next_tokens(data, tmp_path / "fig3.png")
    assert out.stat().st_size > 10_000
    with pytest.raises(TypeError, match="hf-backend"):
        next_token_distributions(object(), PROMPTS)
