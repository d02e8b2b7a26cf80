"""gnll's own decoding loop (shared prefix, per-prompt prefill, dropped rows) changes no output.

Reference: transformers' ``model.generate`` on plainly padded prompts (``decoder="generate"``, with
the logits processor that chooses tokens and records log-probs) and teacher-forced scoring.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hf_helpers import FEW_SHOT, QUESTIONS, few_shot, variant

from gnll import GenerationConfig
from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.backends.hf import MIN_SHARED_PREFIX

pytestmark = pytest.mark.model

PROMPTS = few_shot(QUESTIONS[:3])


class Counter:
    """Shapes of the ``input_ids`` of every forward call of a model."""

    def __init__(self, module):
        self.shapes: list[tuple[int, int]] = []
        self.handle = module.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, module, args, kwargs):
        self.shapes.append(tuple(kwargs["input_ids"].shape))

    @property
    def positions(self) -> int:
        return sum(r * c for r, c in self.shapes)


@pytest.mark.parametrize("model_fixture", ["smollm", "gemma"])
def test_fast_greedy_equals_transformers_generate(model_fixture, request):
    model = request.getfixturevalue(model_fixture)
    reference = request.getfixturevalue(f"{model_fixture}_generate")
    assert model.decoder == "loop" and model.info()["decoder"] == "loop"
    cfg = GenerationConfig.greedy(max_new_tokens=20)
    fast = model.generate(PROMPTS, cfg, batch_size=len(PROMPTS))
    ref = reference.generate(PROMPTS, cfg, batch_size=len(PROMPTS))
    for [a], [b] in zip(fast, ref, strict=True):
        assert a.token_ids == b.token_ids and a.text == b.text
        assert a.finish_reason == b.finish_reason
        assert a.terminator_token_ids == b.terminator_token_ids
        np.testing.assert_allclose(a.token_logprobs, b.token_logprobs, atol=BATCH_INVARIANCE_ATOL)
        np.testing.assert_allclose(
            a.terminator_logprobs, b.terminator_logprobs, atol=BATCH_INVARIANCE_ATOL
        )


def test_shared_prefix_is_computed_once_and_changes_nothing(smollm):
    encoded = smollm.encode(PROMPTS)
    prefix = smollm.engine.shared_prefix(encoded)
    assert prefix is not None and len(prefix.ids) >= MIN_SHARED_PREFIX
    assert all(e[: len(prefix.ids)] == prefix.ids for e in encoded)
    cfg = GenerationConfig.greedy(max_new_tokens=12)
    counter = Counter(smollm.model)
    try:
        shared = smollm.generate(PROMPTS, cfg, batch_size=len(PROMPTS))
        prefill_positions = counter.positions
    finally:
        counter.handle.remove()
    # Prompt tokens processed: the prefix once plus every suffix, far less than all prompts in full.
    assert prefill_positions < sum(len(e) for e in encoded)
    for p, [g] in zip(PROMPTS, shared, strict=True):
        [[alone]] = smollm.generate([p], cfg)  # one prompt: no shared prefix
        assert g.token_ids == alone.token_ids
        np.testing.assert_allclose(
            g.token_logprobs, alone.token_logprobs, atol=BATCH_INVARIANCE_ATOL
        )
        np.testing.assert_allclose(
            g.token_logprobs, smollm.score_tokens([p], [g.token_ids])[0], atol=1e-4
        )


def test_sampling_independent_of_batching_and_matches_teacher_forcing(smollm):
    cfg = GenerationConfig.sample(4, temperature=0.7, max_new_tokens=10, seed=11)
    big = smollm.generate(PROMPTS, cfg, batch_size=64)  # all prompts in one batch, shared prefix
    small = smollm.generate(PROMPTS, cfg, batch_size=4)  # one prompt per batch
    assert [[g.token_ids for g in gs] for gs in big] == [[g.token_ids for g in gs] for gs in small]
    assert len({tuple(g.token_ids) for gs in big for g in gs}) > 1, "samples should differ"
    prompt = PROMPTS[0]
    prompt_ids = smollm.encode([prompt])[0]
    for g in big[0]:
        np.testing.assert_allclose(
            g.token_logprobs, smollm.score_tokens([prompt], [g.token_ids])[0], atol=1e-4
        )
        # The sampling log-probs are under the tempered distribution actually sampled from.
        ids = torch.tensor([prompt_ids + g.token_ids])
        with torch.inference_mode():
            logits = smollm.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
        tempered = torch.log_softmax(logits / 0.7, dim=-1)
        expect = tempered[torch.arange(len(g.token_ids)), torch.tensor(g.token_ids)].numpy()
        np.testing.assert_allclose(g.sampling_logprobs, expect, atol=1e-4)
    again = smollm.generate(PROMPTS, cfg, batch_size=8)
    assert [[g.token_ids for g in gs] for gs in again] == [[g.token_ids for g in gs] for gs in big]


def test_inverse_cdf_sampling_follows_the_model_distribution(smollm):
    """First tokens of 400 samples: their frequencies match the model's probabilities."""
    prompt = PROMPTS[1]
    n = 400
    cfg = GenerationConfig.sample(n, temperature=1.0, max_new_tokens=1, seed=5, stop=())
    gens = smollm.generate([prompt], cfg, batch_size=n)[0]
    first = [g.token_ids[0] if g.token_ids else g.terminator_token_ids[0] for g in gens]
    ids = torch.tensor([smollm.encode([prompt])[0]])
    with torch.inference_mode():
        probs = torch.softmax(smollm.model(input_ids=ids).logits[0, -1].float(), dim=-1)
    top = int(probs.argmax())
    p = float(probs[top])
    freq = sum(t == top for t in first) / n
    # 5 binomial standard deviations: fails by chance with probability < 1e-6.
    assert abs(freq - p) < 5 * (p * (1 - p) / n) ** 0.5 + 1e-9, (freq, p)


def test_finished_rows_leave_the_batch(smollm):
    """A short and a long answer in one batch: once the short one ends, steps run one row."""
    prompts = [PROMPTS[0], "Count from one to forty in words, separated by commas:"]
    cfg = GenerationConfig.greedy(max_new_tokens=24, stop=("\n",))
    counter = Counter(smollm.model)
    try:
        gens = smollm.generate(prompts, cfg, batch_size=2)
    finally:
        counter.handle.remove()
    lengths = sorted(len(g.token_ids) + len(g.terminator_token_ids) for [g] in gens)
    assert lengths[0] < lengths[1]
    decode_rows = [r for r, c in counter.shapes if c == 1]
    assert len(decode_rows) == lengths[1] - 1  # one forward per token after the first
    assert decode_rows[-1] == 1 and decode_rows.count(2) == lengths[0] - 1


def test_beams_with_shared_prefill_equal_plain_beams(smollm, smollm_generate):
    cfg = GenerationConfig.beam(3, max_new_tokens=10)
    fast = smollm.generate(PROMPTS[:2], cfg, batch_size=6)
    ref = smollm_generate.generate(PROMPTS[:2], cfg, batch_size=6)
    for fs, rs in zip(fast, ref, strict=True):
        assert [g.token_ids for g in fs] == [g.token_ids for g in rs]
        for a, b in zip(fs, rs, strict=True):
            np.testing.assert_allclose(
                a.token_logprobs, b.token_logprobs, atol=BATCH_INVARIANCE_ATOL
            )


def test_sliding_window_models_share_a_prefix_only_when_exact(gemma):
    window = gemma.engine.window
    assert window is not None
    encoded = gemma.encode(PROMPTS)
    prefix = gemma.engine.shared_prefix(encoded)
    assert prefix is not None
    assert len({len(e) for e in encoded}) > 1  # rows of different lengths: a padding hole
    # Inside the window the hole is exact ...
    assert gemma.engine.prefix_fits(prefix, encoded, 10)
    # ... beyond it the window would count padding (and drop prefix keys): not used.
    assert not gemma.engine.prefix_fits(prefix, encoded, window)
    assert not gemma.engine.prefix_fits(prefix, [encoded[0], encoded[0]], window)


def test_full_attention_models_share_any_prefix(smollm):
    assert smollm.engine.window is None
    prefix = smollm.engine.shared_prefix(smollm.encode(PROMPTS))
    assert smollm.engine.prefix_fits(prefix, smollm.encode(PROMPTS), 10**6)


MIXED_QUESTIONS = [
    "Capital of Peru?",
    "Who wrote Hamlet?",
    "Which element has the chemical symbol Au?",
    "In the novel by Herman Melville published in 1851, what is the name of the captain who "
    "hunts the white whale across the oceans of the world with his crew aboard the Pequod?",
    "Which river flows through Vienna, Budapest and Belgrade before it reaches the Black Sea, "
    "passing through ten countries in all?",
    "What is 2 + 2?",
]


@pytest.mark.parametrize("model_fixture", ["smollm", "gemma"])
def test_grouped_prefill_and_late_row_dropping_change_nothing(model_fixture, request):
    """Suffixes of 5 to 40 tokens: prefill runs in length groups; outputs equal transformers'."""
    model = request.getfixturevalue(model_fixture)
    reference = request.getfixturevalue(f"{model_fixture}_generate")
    prompts = [FEW_SHOT.format(q=q) for q in MIXED_QUESTIONS]
    encoded = model.encode(prompts)
    prefix = model.engine.shared_prefix(encoded)
    assert prefix is not None
    cfg = GenerationConfig.greedy(max_new_tokens=16)
    counter = Counter(model.model)
    try:
        fast = model.generate(prompts, cfg, batch_size=len(prompts))
    finally:
        counter.handle.remove()
    prefills = [(r, c) for r, c in counter.shapes if c > 1]
    suffixes = [len(e) - len(prefix.ids) for e in encoded]
    # The prefix once, then more than one group, and fewer positions than one padded pass.
    assert prefills[0] == (1, len(prefix.ids)) and len(prefills) > 2
    assert sum(r * c for r, c in prefills[1:]) < len(prompts) * max(suffixes)
    assert sum(r for r, _ in prefills[1:]) == len(prompts)
    ref = reference.generate(prompts, cfg, batch_size=len(prompts))
    for [a], [b] in zip(fast, ref, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        np.testing.assert_allclose(a.token_logprobs, b.token_logprobs, atol=BATCH_INVARIANCE_ATOL)
    scored = model.score_tokens(prompts, [g.token_ids for [g] in fast])
    for [g], lp in zip(fast, scored, strict=True):
        np.testing.assert_allclose(g.token_logprobs, lp, atol=1e-4)


def test_token_budget_bounds_the_batch_and_changes_no_output(smollm):
    cfg = GenerationConfig.greedy(max_new_tokens=8)
    free = smollm.generate(PROMPTS, cfg, batch_size=64)
    longest = max(len(e) for e in smollm.encode(PROMPTS))
    old = smollm.max_batch_tokens
    smollm.max_batch_tokens = 2 * (longest + 8)  # two rows of the longest prompt
    counter = Counter(smollm.model)
    try:
        bounded = smollm.generate(PROMPTS, cfg, batch_size=64)
    finally:
        counter.handle.remove()
        smollm.max_batch_tokens = old
    assert max(r for r, _ in counter.shapes) == 2
    for [a], [b] in zip(free, bounded, strict=True):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.token_logprobs, b.token_logprobs, atol=BATCH_INVARIANCE_ATOL)


def test_samples_depend_on_the_prompt_not_on_its_batch_or_position(smollm, smollm_generate):
    """Sample j of a prompt is seeded by (seed, prompt, j): alone, inside a batch at another
    position, or through transformers' generate, the same prompt gets the same samples."""
    cfg = GenerationConfig.sample(3, temperature=1.0, max_new_tokens=8, seed=3)
    target = PROMPTS[1]

    def ids(gens):
        return [g.token_ids + g.terminator_token_ids for g in gens]

    alone = ids(smollm.generate([target], cfg)[0])
    last = ids(smollm.generate([PROMPTS[2], PROMPTS[0], target], cfg, batch_size=9)[2])
    first = ids(smollm.generate([target, PROMPTS[0]], cfg, batch_size=3)[0])
    via_generate = ids(smollm_generate.generate([PROMPTS[0], target], cfg)[1])
    assert alone == last == first == via_generate
    assert len({tuple(s) for s in alone}) > 1, "samples of one prompt should differ"
    assert ids(smollm.generate([target], cfg.replace(seed=4))[0]) != alone


def test_decoder_option_is_validated(smollm, smollm_generate):
    with pytest.raises(ValueError, match="decoder must be"):
        variant(smollm, decoder="fast")
    assert smollm_generate.engine is None
