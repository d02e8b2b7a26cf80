"""Loading a checkpoint from a local path (the code path hub ids take), on a tiny random-weight model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnll import GenerationConfig, load_model
from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.backends.hf import HFModel


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


def test_the_callers_tokenizer_is_not_changed(tiny_checkpoint):
    """HFModel pads by itself (left, pad id or else EOS): the tokenizer passed in keeps its state."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gnll.backends.hf.prefill import left_padded

    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint)
    tok.pad_token = None  # padding falls back to EOS
    tok.padding_side = "right"
    state = (tok.pad_token, tok.padding_side, dict(tok.special_tokens_map), len(tok))
    prompts = ["Question: a?\nAnswer:", "Question: something longer here?\nAnswer:"]
    cfg = GenerationConfig.sample(2, temperature=1.0, max_new_tokens=6, stop=(), seed=0)
    outputs = {}
    for decoder in ("loop", "generate"):
        hf = HFModel(model, tok, name="tiny", chat_template=False, decoder=decoder)
        assert hf.pad_token_id == tok.eos_token_id
        outputs[decoder] = hf.generate(prompts, cfg)  # one padded batch
        alone = [hf.generate([p], cfg)[0] for p in prompts]  # no padding at all
        answers = ["yes", "no"]
        scores = hf.score(prompts, answers)
        assert (tok.pad_token, tok.padding_side, dict(tok.special_tokens_map), len(tok)) == state
        for padded, single in zip(outputs[decoder], alone, strict=True):
            assert [g.token_ids for g in padded] == [g.token_ids for g in single]
            for a, b in zip(padded, single, strict=True):
                np.testing.assert_allclose(
                    a.token_logprobs, b.token_logprobs, atol=BATCH_INVARIANCE_ATOL
                )
        singles = [hf.score([p], [a])[0].nll for p, a in zip(prompts, answers, strict=True)]
        assert [s.nll for s in scores] == pytest.approx(singles, abs=BATCH_INVARIANCE_ATOL)
    assert [[g.token_ids for g in gs] for gs in outputs["loop"]] == [
        [g.token_ids for g in gs] for gs in outputs["generate"]
    ]
    # The padding is what the tokenizer made once HFModel had set it up (the former way).
    old = AutoTokenizer.from_pretrained(tiny_checkpoint)
    old.pad_token, old.padding_side = old.eos_token, "left"
    rows = [hf.encode([p])[0] for p in prompts]
    expect = old.pad({"input_ids": rows}, return_tensors="pt")
    ids, mask = left_padded(rows, hf.pad_token_id)
    assert ids.tolist() == expect["input_ids"].tolist()
    assert mask.tolist() == expect["attention_mask"].tolist()


def test_a_model_the_loop_cannot_drive_falls_back_out_loud(tiny_checkpoint, monkeypatch, caplog):
    """The fallback to transformers' generate is several times slower: it is logged and recorded
    in info(), never silent (a transformers rename once sent every model there unnoticed)."""
    import gnll.backends.hf.model as hf_model

    assert load_model(str(tiny_checkpoint), progress=False).info()["decoder"] == "loop"
    monkeypatch.setattr(hf_model, "plain_cache", lambda model: False)
    with caplog.at_level("WARNING", logger="gnll.backends.hf.model"):
        model = load_model(str(tiny_checkpoint), progress=False)
    assert model.info()["decoder"] == "generate"
    assert "transformers' generate" in caplog.text
