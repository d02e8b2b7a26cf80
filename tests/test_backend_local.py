"""Loading a checkpoint from a local path (the code path hub ids take), on a tiny random-weight model."""

from __future__ import annotations

import numpy as np
import pytest

from gnll import GenerationConfig, load_model
from gnll.backends.hf import HFModel

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def tiny_checkpoint(tiny_llama):
    """The tiny random Llama of conftest, saved like any hub checkpoint."""
    return tiny_llama(max_position_embeddings=512)


def test_local_path_loads_and_generates_consistent_logprobs(tiny_checkpoint):
    model = load_model(str(tiny_checkpoint), progress=False, chat_template=False, device="cpu")
    assert isinstance(model, HFModel)
    assert model.info()["source"] == str(tiny_checkpoint)
    prompts = ["Question: a?\nAnswer:", "Question: something longer here?\nAnswer:"]
    gens = model.generate(prompts, GenerationConfig.greedy(max_new_tokens=6))
    for prompt, [g] in zip(prompts, gens, strict=True):
        assert len(g.token_ids) == len(g.token_logprobs)
        assert all(lp <= 0 for lp in g.token_logprobs)
        np.testing.assert_allclose(
            g.token_logprobs, model.score_tokens([prompt], [g.token_ids])[0], atol=1e-4
        )


def test_chat_template_auto_detection(tiny_checkpoint):
    # The directory name carries no instruct marker, so no chat template unless asked for.
    assert not load_model(str(tiny_checkpoint), progress=False).chat_template
    assert load_model(str(tiny_checkpoint), progress=False, chat_template=True).chat_template


def test_bad_arguments_are_reported(tiny_checkpoint):
    model = load_model(str(tiny_checkpoint), progress=False)
    with pytest.raises(TypeError, match="list of strings"):
        model.generate("a bare string")
    with pytest.raises(ValueError, match="token id lists"):
        model.score_tokens(["a", "b"], [[1]])
    with pytest.raises(ValueError, match="unknown backend"):
        load_model(str(tiny_checkpoint), backend="nope")
    with pytest.raises(ValueError, match="greedy decoding returns exactly one"):
        GenerationConfig(strategy="greedy", num_sequences=3)
    with pytest.raises(ValueError, match="temperature"):
        GenerationConfig.sample(2, temperature=0.0)
