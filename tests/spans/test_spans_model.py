"""Planted errors with the real SmolLM2 (teacher forcing only): the JSON field made wrong is the one
whose NLL rises, and the field left alone barely moves."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gnll import score
from gnll.evaluation.data.tasks import get_task
from gnll.spans import span_nlls

pytestmark = pytest.mark.model



def test_the_corrupted_field_carries_the_rise(smollm):
    examples = get_task("triviaqa_short").load().split("eval", 40)
    gold = [e.answers[0] for e in examples]
    wrong = [gold[(i + 7) % len(gold)] for i in range(len(gold))]  # another question's answer
    prompts = [f"{e.question}\nReply in JSON with the keys answer and source." for e in examples]

    def fields(answers):
        texts = [json.dumps({"answer": a, "source": "memory"}) for a in answers]
        out = []
        for s in score(smollm, prompts, texts):
            r = span_nlls(s.tokens, s.token_logprobs, s.text, "json")
            assert abs(sum(x.nll for x in r.spans) + r.unassigned_nll - s.nll) < 1e-9  # same path: float64 sums of the same log-probs
            out.append([x.nll for x in r.spans])
        return np.array(out)

    right, bad = fields(gold), fields(wrong)
    rise = bad[:, 0] - right[:, 0]  # $.answer
    moved = np.abs(bad[:, 1] - right[:, 1])  # $.source, after the corrupted field
    # 27 of 40 when this was written; a model blind to the swap would be near 20
    assert np.mean(rise > 0) >= 0.6
    assert np.median(moved) < np.median(rise) / 4
