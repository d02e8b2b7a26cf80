"""A checkpoint's own generation_config (sampling, top-k, repetition penalty) must not leak in."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers import GenerationConfig as HFGenerationConfig

from gnll import GenerationConfig, load_model
from gnll.backends.registry import EMBEDDED_MODELS, embedded_model_dir

PROMPTS = [
    "Question: What is the capital of France?\nAnswer:",
    "Question: Who wrote Hamlet?\nAnswer:",
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The same tiny random Llama twice: plain, and with a generation config that samples."""
    import torch

    tok = AutoTokenizer.from_pretrained(
        embedded_model_dir(EMBEDDED_MODELS["smollm2-135m-instruct"])
    )
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    paths = {}
    for kind in ("plain", "sampling"):
        path = tmp_path_factory.mktemp(kind)
        model.generation_config = HFGenerationConfig(
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            **(
                {
                    "do_sample": True,
                    "top_k": 5,
                    "temperature": 3.0,
                    "repetition_penalty": 2.0,
                    "no_repeat_ngram_size": 2,
                }
                if kind == "sampling"
                else {}
            ),
        )
        model.save_pretrained(path)
        tok.save_pretrained(path)
        paths[kind] = str(path)
    return paths


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
                np.testing.assert_allclose(x.token_logprobs, y.token_logprobs, atol=1e-5)
    # and the greedy log-probs are the raw model's (teacher-forced scoring agrees)
    [[g]] = sampling.generate(PROMPTS[:1], GenerationConfig.greedy(max_new_tokens=10, stop=()))
    [scored] = sampling.score(PROMPTS[:1], [g.text], raw_prompt=True)
    if scored.token_ids == g.token_ids:
        np.testing.assert_allclose(scored.token_logprobs, g.token_logprobs, atol=1e-4)
