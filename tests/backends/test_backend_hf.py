"""The transformers backend on the real embedded models: log-probs are exact, batching changes nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnll import GenerationConfig, measures
from gnll._util import cache_dir
from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.backends.registry import EMBEDDED_MODELS, embedded_model_dir

pytestmark = pytest.mark.model

QUESTIONS = [
    "What is the capital of France?",
    "Who wrote the play Hamlet?",
    "What is 7 times 6?",
    "Which planet is known as the red planet?",
    "In which year did the Second World War end?",
]
FEW_SHOT = (
    "Answer the following question as briefly as possible.\n"
    "Question: What is the largest ocean?\nAnswer: The Pacific Ocean\n"
    "Question: Who painted the Mona Lisa?\nAnswer: Leonardo da Vinci\n"
    "Question: {q}\nAnswer:"
)


def _full_logprobs(model, prompt: str, answer_ids: list[int]) -> torch.Tensor:
    """Teacher-forced full log-softmax rows for each answer position (test oracle, no batching)."""
    prompt_ids = model.encode([prompt])[0]
    ids = torch.tensor([prompt_ids + answer_ids])
    with torch.inference_mode():
        logits = model.model(input_ids=ids).logits[0].float()
    start = len(prompt_ids) - 1
    return torch.log_softmax(logits[start : start + len(answer_ids)], dim=-1)


@pytest.mark.parametrize("model_fixture", ["smollm", "gemma"])
def test_greedy_logprobs_match_teacher_forcing_and_are_argmax(model_fixture, request):
    model = request.getfixturevalue(model_fixture)
    prompts = [FEW_SHOT.format(q=q) for q in QUESTIONS[:3]]
    gens = model.generate(prompts, GenerationConfig.greedy(max_new_tokens=24))
    for prompt, [g] in zip(prompts, gens, strict=True):
        assert g.token_ids, f"empty greedy answer for {prompt!r}"
        rows = _full_logprobs(model, prompt, g.token_ids)
        oracle = rows[torch.arange(len(g.token_ids)), torch.tensor(g.token_ids)].numpy()
        np.testing.assert_allclose(g.token_logprobs, oracle, atol=1e-4)
        assert rows.argmax(dim=-1).tolist() == g.token_ids, "greedy token is not the argmax"
        # The backend's own scorer (batched, logits_to_keep) agrees too.
        np.testing.assert_allclose(
            model.score_tokens([prompt], [g.token_ids])[0], oracle, atol=1e-4
        )
        # G-NLL is the sum of the max log-probs along the greedy path.
        assert measures.g_nll(g.token_logprobs) == pytest.approx(
            -rows.max(dim=-1).values.sum().item(), abs=1e-3
        )


def test_batched_equals_one_by_one(smollm):
    prompts = [FEW_SHOT.format(q=q) for q in QUESTIONS]
    config = GenerationConfig.greedy(max_new_tokens=24)
    batched = smollm.generate(prompts, config, batch_size=len(prompts))
    single = [smollm.generate([p], config, batch_size=1)[0] for p in prompts]
    for [b], [s] in zip(batched, single, strict=True):
        assert b.text == s.text
        assert b.token_ids == s.token_ids
        assert measures.g_nll(b.token_logprobs) == pytest.approx(
            measures.g_nll(s.token_logprobs), abs=1e-4
        )


def test_short_answer_stops_at_newline_and_terminator_option(smollm):
    prompt = FEW_SHOT.format(q="What is the capital of France?")
    [[g]] = smollm.generate([prompt], GenerationConfig.greedy())
    assert "Paris" in g.text
    assert "\n" not in g.text
    assert g.finish_reason in {"stop", "eos"}
    assert len(g.terminator_token_ids) == 1 and len(g.terminator_logprobs) == 1
    [[t]] = smollm.generate([prompt], GenerationConfig.greedy(include_terminator=True))
    assert t.token_logprobs == pytest.approx(g.token_logprobs + g.terminator_logprobs)
    assert measures.g_nll(t.token_logprobs) > measures.g_nll(g.token_logprobs)


def test_length_cap(smollm):
    [[g]] = smollm.generate(
        ["Tell me a long story about a dragon."], GenerationConfig.greedy(max_new_tokens=5)
    )
    assert g.finish_reason == "length"
    assert len(g.token_ids) == len(g.token_logprobs) == 5
    assert g.terminator_token_ids == []


def test_multi_token_stop_string_is_cut(smollm):
    """`StopRules.split` cuts at a stop string that spans tokens and keeps only tokens before it."""
    tok = smollm.tokenizer
    ids = tok(" Paris Question: Who", add_special_tokens=False)["input_ids"]
    raw = -np.arange(1, len(ids) + 1, dtype=float) / 10
    config = GenerationConfig.greedy()
    g = smollm.stop_rules(config.stop).split(ids, raw, None, config)
    assert g.text == "Paris"
    assert g.finish_reason == "stop" and g.stop_sequence == "Question:"
    assert tok.decode(g.token_ids).strip() == "Paris"
    assert g.token_logprobs == pytest.approx(raw[: len(g.token_ids)].tolist())
    assert tok.decode(g.terminator_token_ids).strip().startswith("Question")


def test_beam_search_returns_k_ranked_beams(smollm):
    prompts = [FEW_SHOT.format(q=q) for q in QUESTIONS[:2]]
    beams = smollm.generate(prompts, GenerationConfig.beam(4, max_new_tokens=16))
    greedy = smollm.generate(prompts, GenerationConfig.greedy(max_new_tokens=16))
    for prompt, bs, [g] in zip(prompts, beams, greedy, strict=True):
        assert len(bs) == 4
        lps = [b.logprob for b in bs]
        assert lps == sorted(lps, reverse=True)
        for b in bs:
            np.testing.assert_allclose(
                b.token_logprobs, smollm.score_tokens([prompt], [b.token_ids])[0], atol=1e-4
            )
            assert b.sampling_logprobs is None
        # Beam search explores a superset of the greedy path's prefixes; here it finds at least as likely.
        assert (
            measures.msp_estimate([b.token_logprobs for b in bs])
            <= measures.g_nll(g.token_logprobs) + 1e-4
        )


def test_sampling_is_seeded_and_reports_both_logprobs(smollm):
    prompt = FEW_SHOT.format(q="Who wrote the play Hamlet?")
    cfg = GenerationConfig.sample(6, temperature=0.5, max_new_tokens=12, seed=123)
    a = smollm.generate([prompt], cfg)[0]
    b = smollm.generate([prompt], cfg)[0]
    c = smollm.generate([prompt], cfg.replace(seed=7))[0]
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.token_ids for g in a] != [g.token_ids for g in c]
    for g in a:
        np.testing.assert_allclose(
            g.token_logprobs, smollm.score_tokens([prompt], [g.token_ids])[0], atol=1e-4
        )
        assert len(g.sampling_logprobs) == len(g.token_logprobs)
    # At temperature 1 the sampling distribution is the model's own.
    for g in smollm.generate([prompt], cfg.replace(temperature=1.0))[0]:
        assert g.sampling_logprobs == pytest.approx(g.token_logprobs)


def test_chat_template_applied_only_to_instruction_tuned(smollm, gemma):
    assert smollm.chat_template and "<|im_start|>user\nHi<|im_end|>" in smollm.render_prompt("Hi")
    assert not gemma.chat_template and gemma.render_prompt("Hi") == "Hi"


def test_embedded_models_are_cached():
    for spec in EMBEDDED_MODELS.values():
        path = embedded_model_dir(spec, progress=False)
        assert path.is_relative_to(cache_dir())
        assert (path / "gnll-model.json").exists() and (path / "config.json").exists()


@pytest.mark.parametrize("model_fixture", ["smollm", "gemma"])
def test_fast_tokenizer_of_cached_models_equals_autotokenizer(model_fixture, request):
    """The cached embedded models load their tokenizer from tokenizer.json directly (for speed);
    it must tokenize, decode, pad and render chat prompts exactly like ``AutoTokenizer``."""
    from transformers import AutoTokenizer

    model = request.getfixturevalue(model_fixture)
    fast, auto = model.tokenizer, AutoTokenizer.from_pretrained(model.source)
    texts = [
        FEW_SHOT.format(q=QUESTIONS[0]),
        "  Émile Zola's <b>naïve</b> café\n\nQuestion: 3.14 × 2 = ?",
        "Context: Tom has 5 apples.\nQuestion: How many?\nAnswer: 5\n",
    ]
    for special in (True, False):
        assert (
            fast(texts, add_special_tokens=special)["input_ids"]
            == auto(texts, add_special_tokens=special)["input_ids"]
        )
    ids = auto(texts[1])["input_ids"]
    assert fast.decode(ids) == auto.decode(ids)
    assert fast.convert_ids_to_tokens(ids) == auto.convert_ids_to_tokens(ids)
    for attr in ("bos_token_id", "eos_token_id", "unk_token_id"):
        assert getattr(fast, attr) == getattr(auto, attr), attr
    assert bool(fast.chat_template) == bool(auto.chat_template)
    if auto.chat_template:
        chat = [{"role": "user", "content": texts[0]}]
        assert fast.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=False
        ) == auto.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)


@pytest.mark.parametrize("model_fixture", ["smollm", "gemma"])
def test_scoring_own_greedy_answers_reproduces_g_nll(model_fixture, request):
    """Text-level score of the model's own greedy answers (verbatim): the same tokens, G-NLL within
    1e-4, every token the top-1, and greedy decoding stops right after them."""
    model = request.getfixturevalue(model_fixture)
    prompts = [FEW_SHOT.format(q=q) for q in QUESTIONS]
    gens = [g for [g] in model.generate(prompts, GenerationConfig.greedy(max_new_tokens=24))]
    answers = [model.tokenizer.decode(g.token_ids) for g in gens]
    scored = model.score(prompts, answers, batch_size=2)  # several batches, shared prefix
    for g, s in zip(gens, scored, strict=True):
        assert not s.boundary_merged
        assert s.token_ids == g.token_ids and s.num_tokens == len(g.token_ids)
        assert s.nll == pytest.approx(measures.g_nll(g.token_logprobs), abs=1e-4)
        np.testing.assert_allclose(s.token_logprobs, g.token_logprobs, atol=1e-4)
        assert s.is_greedy is True
        if g.finish_reason != "length":  # cut by max_new_tokens: greedy may or may not stop there
            assert s.greedy_stops is True
    # Batching changes nothing: one by one gives the same numbers.
    for p, a, s in zip(prompts, answers, scored, strict=True):
        [alone] = model.score([p], [a])
        np.testing.assert_allclose(
            alone.token_logprobs, s.token_logprobs, atol=BATCH_INVARIANCE_ATOL
        )


def test_scoring_chat_answers_and_perturbations(smollm):
    prompt = "What is the capital of France? Answer in one sentence."
    [[g]] = smollm.generate([prompt], GenerationConfig.greedy(max_new_tokens=30))
    [own, longer, wrong] = smollm.score(
        [prompt] * 3, [g.text, g.text + " Berlin is nice.", "Berlin."]
    )
    assert own.nll == pytest.approx(-g.logprob, abs=1e-4) and own.is_greedy and own.greedy_stops
    assert own.tokens == g.tokens
    # Continuing past where greedy stops: no longer greedy, and every extra token costs NLL.
    assert longer.is_greedy is False and longer.nll > own.nll + 1e-3
    assert wrong.is_greedy is False and wrong.nll > own.nll
    assert all(lp <= 0 and np.isfinite(lp) for s in (own, longer, wrong) for lp in s.token_logprobs)


def test_scoring_flags_a_merged_boundary(smollm):
    """A raw prompt ending in a space before the answer: the tokenizer merges " Paris" across the
    boundary; the row is flagged and scored as the prompt's own tokens + the answer's tokens."""
    tok = smollm.tokenizer
    raw = "Question: What is the capital of France?\nAnswer: "
    [merged, clean] = smollm.score([raw, raw.rstrip(" ")], ["Paris", " Paris"], raw_prompt=True)
    assert merged.boundary_merged and not clean.boundary_merged
    assert merged.token_ids == tok("Paris", add_special_tokens=False)["input_ids"]
    assert clean.token_ids == tok(" Paris", add_special_tokens=False)["input_ids"]
    # Oracle: the raw prompt's own tokens, then the answer's, through one plain forward pass.
    prompt_ids = tok(raw, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + merged.token_ids])
    with torch.inference_mode():
        rows = torch.log_softmax(smollm.model(input_ids=ids).logits[0].float(), dim=-1)
    pos = torch.arange(len(prompt_ids) - 1, ids.shape[1] - 1)
    expect = rows[pos, torch.tensor(merged.token_ids)].numpy()
    np.testing.assert_allclose(merged.token_logprobs, expect, atol=1e-4)
    with pytest.raises(ValueError, match="2 prompts but 1 answers"):
        smollm.score(["a", "b"], ["x"])
    with pytest.raises(TypeError, match="lists of strings"):
        smollm.score("a", "b")
