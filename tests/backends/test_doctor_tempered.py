"""``gnll doctor``'s raw check tells tempered log-probs by their signature: at temperature T the
gaps between a position's alternatives are the raw gaps divided by T. On constructed responses
(a stand-in's numbers); the real vLLM started with ``--logprobs-mode processed_logprobs`` is in
tests/backends/test_server_vllm.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from gnll.backends.openai.doctor import HOT, _raw_check
from gnll.backends.openai.parse import RawTokens

LOGITS = [np.array([3.0, 1.0, 0.2, -1.0]), np.array([2.5, 2.0, -0.5, -2.0])]
NAMES = ["a", "b", "c", "d"]


def _raw(temperature: float, shift: float = 0.0) -> RawTokens:
    tops = []
    for z in LOGITS:
        z = z / temperature
        lp = z - np.log(np.exp(z).sum()) + shift
        tops.append({n: float(v) for n, v in zip(NAMES, lp, strict=True)})
    return RawTokens(
        text="aa", tokens=["a", "a"], token_ids=None, logprobs=[t["a"] for t in tops],
        token_bytes=None, top1=[("a", t["a"]) for t in tops], tops=tops, finish_reason="stop",
        stop_reason=None, has_stop_reason=False,
    )  # fmt: skip


def _check(profile: str, hot: RawTokens):
    model = SimpleNamespace(profile=SimpleNamespace(name=profile))
    return _raw_check(model, [_raw(1.0)], lambda **kw: [hot])


def test_tempered_log_probs_are_named_on_vllm_and_elsewhere():
    vllm = _check("vllm", _raw(HOT))
    assert vllm.verdict == "fail" and "shrink to 0.50 of the greedy ones" in vllm.detail
    assert "--logprobs-mode processed_logprobs" in vllm.detail
    assert "restart vLLM without --logprobs-mode processed_logprobs" in vllm.fix
    other = _check("llama.cpp", _raw(HOT))
    assert other.verdict == "fail" and "tempered by the request's temperature" in other.detail
    assert "processed_logprobs" not in other.detail


def test_other_processing_fails_without_the_tempered_name():
    """Log-probs moved without the 1/T signature (here: shifted) fail as processed, unnamed."""
    shifted = _check("vllm", _raw(1.0, shift=-0.5))
    assert shifted.verdict == "fail" and "shrink to" not in shifted.detail
    assert "processed (tempered/truncated)" in shifted.detail


def test_raw_log_probs_pass():
    assert _check("vllm", _raw(1.0)).verdict == "pass"
