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
