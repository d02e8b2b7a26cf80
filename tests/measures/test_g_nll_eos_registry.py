"""``g-nll+eos`` in the measure registry: a named variant, computed from the greedy answer and its
terminator, never selected by default or by ``"all"``."""

from __future__ import annotations

import pytest

from gnll import measures as M
from gnll.backends.base import Generation


def _gen(tokens, logprobs, finish="stop", terminator=(-0.5, -0.25)):
    ids = list(range(len(tokens)))
    term = [] if finish == "length" else list(terminator)
    return Generation(
        "".join(tokens),
        ids,
        list(tokens),
        list(logprobs),
        finish,
        terminator_token_ids=[9] * len(term),
        terminator_logprobs=term,
    )


def test_registered_as_a_variant_only():
    m = M.get("g-nll+eos")
    assert (m.name, m.label, m.source) == (M.G_NLL_EOS, "G-NLL+EOS", "greedy")
    assert "g-nll+eos" not in M.ORDER and "g-nll+eos" not in M.validate("all")
    assert M.validate("g-nll+eos,pe", paper_order=True) == ["pe", "g-nll+eos"]
    assert M.requirements(["g-nll+eos"]) == M.Needs.GREEDY | M.Needs.TERMINATOR
    with pytest.raises(ValueError, match="g-nll\\+eos"):
        M.get("g-nll+bos")


@pytest.mark.parametrize(
    ("gen", "expected"),
    [
        (_gen(["a", "b"], [-1.0, -2.0]), 3.75),  # answer + whole stop string
        (_gen(["a", "b"], [-1.0, -2.0], finish="length"), 3.0),  # cut: no terminator to add
        (_gen([], []), 0.75),  # empty: the stop string once (G-NLL is its first token's NLL)
        (_gen(["a"], [-1.0], finish="eos", terminator=(-0.125,)), 1.125),
    ],
)
def test_computed_from_a_generation(gen, expected):
    values = M.compute(["g-nll", "g-nll+eos"], greedy=gen)
    assert values["g-nll+eos"] == pytest.approx(expected)
    assert values["g-nll+eos"] == pytest.approx(
        M.g_nll_eos(gen.token_logprobs, gen.terminator_logprobs)
    )
    assert values["g-nll"] == pytest.approx(M.g_nll(gen.measured_logprobs))


def test_unknown_terminator_is_not_computable():
    # a server that reports no log-prob for the stop token: the variant cannot be computed
    gen = _gen(["a"], [-1.0], terminator=())
    gen.terminator_token_ids = [9]
    ev = M.Evidence.of(gen)
    assert ev.terminator is None
    assert M.computable(["g-nll", "g-nll+eos"], ev.available) == ["g-nll"]
    with pytest.raises(ValueError, match="terminator"):
        M.compute(["g-nll+eos"], greedy=[-1.0])
