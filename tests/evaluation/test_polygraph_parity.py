"""LM-Polygraph's numbers, exactly: its MaximumSequenceProbability and PRR metrics (issue 39.5).

``data/polygraph_msp.json`` holds numbers recorded from the real ``lm-polygraph`` package
(``scripts/polygraph_fixture.sh``: its own venv, gnll's embedded SmolLM2 handed to its
``WhiteboxModel``): per question its greedy tokens, their log-likelihoods and its MSP, the quality
(F1 > 0.5), and its ``prr``, ``prr_0.5`` and ``_normalized`` metrics. These tests need no
lm-polygraph: gnll's ``g-nll+eos`` variant and ``prr_metrics`` must give the same numbers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gnll import measures as M
from gnll.evaluation.results.metrics import prr_metrics

FIXTURE = json.loads((Path(__file__).parent / "data" / "polygraph_msp.json").read_text())
ROWS = FIXTURE["rows"]


def test_prr_metrics_equal_lm_polygraphs():
    got = prr_metrics([r["msp"] for r in ROWS], [r["quality"] for r in ROWS])
    want = FIXTURE["metrics"]
    assert set(got) == set(want) == {"prr", "prr_0.5", "prr_normalized", "prr_0.5_normalized"}
    for name, value in want.items():
        assert math.isclose(got[name], value, rel_tol=0, abs_tol=1e-12), name  # same path: float64 formula on the same log-probs
    # the data set is not degenerate: both classes, and PRR differs from its normalised form
    assert 0 < sum(r["quality"] for r in ROWS) < len(ROWS)
    assert got["prr"] != got["prr_normalized"]


def test_msp_is_the_sum_including_the_terminator():
    """MSP sums every greedy token up to and including the one that ended the answer: gnll's
    ``g_nll_eos`` of (answer, terminator) gives it; gnll's G-NLL (answer only) does not."""
    differ = 0
    for r in ROWS:
        lls = r["greedy_log_likelihoods"]
        answer, terminator = lls[:-1], lls[-1:]
        # LM-Polygraph sums float32 log-probs; gnll sums them in float64
        assert math.isclose(M.g_nll_eos(answer, terminator), r["msp"], rel_tol=0, abs_tol=1e-5)  # same path: the same log-probs, summed in float32 by LM-Polygraph
        differ += not math.isclose(M.g_nll(answer), r["msp"], abs_tol=1e-6)  # same path: counts values that differ: a tight tolerance is the strict side
    assert differ == len(ROWS)
    assert M.G_NLL_EOS == "g-nll+eos"


@pytest.mark.model
def test_gnll_greedy_answers_give_lm_polygraphs_msp():
    """gnll's own greedy decoding of the same prompts on the same model gives the same answers and
    token ids, and ``g_nll_eos`` of its answer and terminator log-probs gives the recorded MSP once
    the first two steps are renormalised without EOS, as LM-Polygraph's ``min_new_tokens=2`` does
    before it records log-probs (``masked_logprobs``: EOS's log-prob at those steps, from one
    forward pass). Without it, the one-token answers (whose terminator is step 2, where EOS has
    weight) differ by up to .02."""
    import torch

    from gnll import load_model
    from gnll.backends.base import GenerationConfig

    lm = load_model(FIXTURE["model"], chat_template=False, progress=False)
    config = GenerationConfig.greedy(max_new_tokens=FIXTURE["max_new_tokens"])
    gens = [g[0] for g in lm.generate([r["prompt"] for r in ROWS], config)]
    eos = lm.tokenizer.eos_token_id
    exact, plain = 0.0, 0.0
    for r, g in zip(ROWS, gens, strict=True):
        assert g.text == r["greedy_text"].strip()
        assert list(g.token_ids) + list(g.terminator_token_ids) == r["greedy_tokens"]
        prompt_ids = lm.encode([r["prompt"]])[0]
        with torch.no_grad():
            logits = lm.model(torch.tensor([prompt_ids + r["greedy_tokens"][:1]])).logits[0]
        eos_lp = torch.log_softmax(logits[-2:].double(), dim=-1)[:, eos].tolist()
        ours = M.g_nll_eos(g.token_logprobs, g.terminator_logprobs, masked_logprobs=eos_lp)
        exact = max(exact, abs(ours - r["msp"]))
        plain = max(plain, abs(M.g_nll_eos(g.token_logprobs, g.terminator_logprobs) - r["msp"]))
        assert abs(M.g_nll(g.token_logprobs) - r["msp"]) > 1e-6  # the paper's G-NLL differs
    assert exact < 2e-4, exact  # fp32 forward passes of two decoding loops
    assert plain > 1e-3  # the renormalisation matters on this sample


# LM-Polygraph's own defaults (``scripts/polygraph_fixture.sh --defaults``): the chat template
# (``WhiteboxModel(instruct=True)``), no stop strings (only EOS ends an answer), the same 40 prompts
# each as one user turn; its answers are sentences (all 40 qualities are 0, F1 <= 0.5), so only the
# MSP is compared. ``--defaults --multiturn``: the few-shot examples as chat turns (16 questions).
# Neither has an answer with EOS greedy at step 1 or 2 (SmolLM2's shortest are 4 tokens), so
# ``--defaults --prompt ...`` records four prompts of one's own, two of which gnll answers "no"
# and EOS: the case where LM-Polygraph, masking EOS, generates another answer.
DATA = Path(__file__).parent / "data"
UNDER_DEFAULTS = [
    "polygraph_msp_defaults.json",
    "polygraph_msp_multiturn.json",
    "polygraph_msp_prompts.json",
]


@pytest.mark.parametrize("name", UNDER_DEFAULTS)
def test_defaults_fixtures_are_lm_polygraphs_defaults(name):
    fixture = json.loads((DATA / name).read_text())
    assert fixture["instruct"] is True and fixture["stop_strings"] is None
    assert fixture["min_new_tokens"] == 2
    eos = fixture["eos_token_id"]
    ends = [r["greedy_tokens"][-1] == eos for r in fixture["rows"]]
    # unlike the first fixture (every answer ended by "\n"), EOS ends most answers; the rest are cut
    # at max_new_tokens (no terminator)
    assert sum(ends) > len(ends) / 2
    for r, ended in zip(fixture["rows"], ends, strict=True):
        assert ended or len(r["greedy_tokens"]) == fixture["max_new_tokens"]
        # EOS is never LM-Polygraph's token at steps 1-2: min_new_tokens=2 masks it there
        assert eos not in r["greedy_tokens"][:2]


@pytest.mark.model
@pytest.mark.parametrize("name", UNDER_DEFAULTS)
def test_g_nll_eos_is_lm_polygraphs_msp_under_its_defaults_where_the_answers_agree(name):
    """gnll, with the chat template and no stop strings, decodes greedily without masking EOS; its
    answer is LM-Polygraph's wherever EOS is not the greedy token at step 1 or 2, and there
    ``g_nll_eos`` with the masked steps' EOS log-probs is LM-Polygraph's MSP (the project's
    log-prob tolerance per token: fp32 passes of two decoding loops, summed over up to 50 tokens).
    Where EOS is greedy at step 1 or 2 LM-Polygraph generates another answer: those are counted
    (``eos_at_step_le_2`` in results.json) and must be the only disagreements."""
    import torch

    from gnll import load_model
    from gnll.backends.base import BATCH_INVARIANCE_ATOL, ChatPrompt, GenerationConfig

    fixture = json.loads((DATA / name).read_text())
    lm = load_model(fixture["model"], chat_template=True, progress=False)
    config = GenerationConfig.greedy(max_new_tokens=fixture["max_new_tokens"], stop=())
    rows = fixture["rows"]
    prompts = [ChatPrompt(r["prompt"], r["messages"]) if "messages" in r else r["prompt"]
               for r in rows]  # fmt: skip
    gens = [g[0] for g in lm.generate(prompts, config)]
    eos = fixture["eos_token_id"]
    agree, early, worst = 0, 0, 0.0
    for r, p, g in zip(rows, prompts, gens, strict=True):
        prompt_ids = lm.encode([p])[0]
        assert prompt_ids == r["input_tokens"]  # the same chat-templated prompt
        ours = list(g.token_ids) + list(g.terminator_token_ids)
        eos_early = g.finish_reason == "eos" and len(g.token_ids) <= 1
        if ours != r["greedy_tokens"]:
            assert eos_early, (r["id"], ours[:5], r["greedy_tokens"][:5])
            assert len(r["greedy_tokens"]) > len(ours)  # LM-Polygraph's answer runs on
            early += 1
            continue
        assert not eos_early
        agree += 1
        with torch.no_grad():
            logits = lm.model(torch.tensor([prompt_ids + r["greedy_tokens"][:1]])).logits[0]
        eos_lp = torch.log_softmax(logits[-2:].double(), dim=-1)[:, eos].tolist()
        ours_msp = M.g_nll_eos(g.token_logprobs, g.terminator_logprobs, masked_logprobs=eos_lp)
        worst = max(worst, abs(ours_msp - r["msp"]) / len(r["greedy_tokens"]))
    print(
        f"{name}: agree {agree}, EOS greedy at step <= 2: {early}, max |MSP diff|/token {worst:.2e}"
    )
    assert agree + early == len(rows) and agree >= len(rows) / 4
    assert worst < BATCH_INVARIANCE_ATOL, worst
    if "prompts" in name:  # two yes/no prompts: gnll answers "no" and EOS (step 2)
        assert early == 2  # LM-Polygraph, which cannot stop there, answers "no, the sky is ..."
