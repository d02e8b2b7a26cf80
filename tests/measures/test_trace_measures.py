"""DeepConf's trace confidences (gnll.measures.trace), checked against hand computations."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gnll.backends.openai.parse import read_choice
from gnll.measures import group_confidence, token_confidence, trace_confidence

FIX = Path(__file__).parents[1] / "fixtures" / "reasoning"


def test_token_confidence_is_minus_the_mean_top_k_logprob():
    assert token_confidence([[-1.0, -3.0], [-0.5]]).tolist() == [2.0, 0.5]
    with pytest.raises(ValueError, match="token 1 has no log-prob"):
        token_confidence([[-1.0], []])
    with pytest.raises(ValueError, match="not finite"):
        token_confidence([[float("-inf")]])


def test_groups_tail_and_bottom_ten_percent_by_hand():
    conf = np.arange(1.0, 31.0)  # 30 tokens, confidences 1..30
    groups = group_confidence(conf, window=5)
    assert len(groups) == 26 and groups[0] == 3.0 and groups[-1] == 28.0
    t = trace_confidence(conf, window=5)
    assert t["lowest_group"] == 3.0  # mean of 1..5
    assert t["tail"] == 28.0  # mean of 26..30
    assert t["bottom_10pct"] == pytest.approx(np.mean([3.0, 4.0]))  # lowest 2 of 26 groups
    short = trace_confidence([1.0, 2.0], window=2048)  # shorter than a window: one group
    assert short["lowest_group"] == short["tail"] == short["bottom_10pct"] == 1.5
    assert trace_confidence([])["tail"] is None


def test_a_servers_trace_gets_its_confidences_from_the_reported_alternatives():
    choice = json.loads((FIX / "vllm_chat.json").read_text())["choices"][0]
    for e in choice["logprobs"]["content"]:  # two alternatives per position
        e["top_logprobs"].append({"token": "x", "logprob": e["logprob"] - 2.0, "bytes": [120]})
    split = read_choice(choice).reasoning
    conf = split.trace_confidence()
    trace = [-0.5, -0.3, -0.7, -0.7, -0.4, -0.3, -0.6, -0.31]
    assert conf["k"] == 2
    assert conf["tail"] == pytest.approx(np.mean([-(2 * v - 2.0) / 2 for v in trace]))
    assert conf["lowest_group"] == conf["tail"]  # 8 tokens: one group
