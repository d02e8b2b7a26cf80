"""Early decisions through the real stop-string hold-back and the backend's real answer cut.

A toy tokenizer with multi-token stop strings ("Quest:" spans " Quest" + ":", or "Q" "ue" "st"
":") and a single-character one ("\\n") drives the engine's :class:`EarlyStop` (``HeldText`` +
the policy's ``EarlyDecision``) token by token, as the decoding loop does, and the same tokens
are cut by :meth:`StopRules.split`, as the backend cuts a finished answer. For random token
streams, log-probs and thresholds: an early decision is made only where the finished answer is
refused too, its tokens are a prefix of that answer's, and an answer the early rule never decided
is decided at its end exactly as without early decisions.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnll.backends.base import GenerationConfig
from gnll.backends.decoding import EarlyStop
from gnll.backends.held import HeldText
from gnll.backends.hf.stopping import StopRules
from gnll.measures import g_nll
from gnll.policy import AbstentionPolicy

VOCAB = {
    **{0: "", 1: " a", 2: " b", 3: "Q", 4: "ue", 5: "st", 6: ":", 7: " Quest", 8: "\n", 9: " c"},
    10: " ",  # held back (trailing white space) and released with the next token
}
EOS = 0
STOP = ("Quest:", "\n")


class ToyTokenizer:
    clean_up_tokenization_spaces = False

    def get_vocab(self):
        return {v or "<eos>": k for k, v in VOCAB.items()}

    def __len__(self):
        return len(VOCAB)

    def decode(self, ids):
        return "".join(VOCAB[i] for i in ids)

    def batch_decode(self, rows):
        return [self.decode(r) for r in rows]

    def convert_ids_to_tokens(self, ids):
        return [VOCAB[i] or "<eos>" for i in ids]


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    import os

    os.environ.setdefault("GNLL_CACHE", str(tmp_path_factory.mktemp("cache")))
    return StopRules(ToyTokenizer(), STOP, {EOS})


@st.composite
def streams(draw):
    ids = draw(st.lists(st.integers(0, 10), min_size=1, max_size=30))
    lps = [-draw(st.floats(0.0, 3.0)) for _ in ids]
    tau = draw(st.floats(0.0, 20.0))
    return ids, lps, tau


@settings(max_examples=400, deadline=None)
@given(case=streams())
def test_early_stop_through_holdback_equals_the_backends_cut(rules, case):
    ids, lps, tau = case
    max_new = 30
    config = GenerationConfig.greedy(max_new_tokens=max_new, stop=STOP)
    policy = AbstentionPolicy(mode="refuse", threshold=tau)
    tok = ToyTokenizer()
    watch = EarlyStop(
        HeldText(tok.decode, rules.token_ids, rules.strings), policy.early_decision(), max_new
    )
    # The decoding loop: a row ends at a stop token, a stop string in its tail, or its watch.
    generated, decided = [], False
    for i, lp in zip(ids, lps, strict=True):
        generated.append(i)
        if watch(i, lp):
            decided = True
            break
        if i in rules.token_ids or rules.ended_by_text([generated])[0]:
            break
    # The finished answer without early decisions: every token up to the natural end, cut.
    natural = []
    for i in ids:
        natural.append(i)
        if i in rules.token_ids or rules.ended_by_text([natural])[0]:
            break
    import numpy as np

    full = rules.split(natural, np.asarray(lps[: len(natural)]), None, config)
    try:
        measured = full.measured_logprobs
    except ValueError:  # an empty answer that ran out of tokens before its stop token
        return
    end_abstains = policy.decide(g_nll(measured))[1]
    if decided:
        gen = watch.generation()
        assert end_abstains, "decided early on an answer the end would keep"
        assert gen.token_ids == full.token_ids[: len(gen.token_ids)]
        assert gen.token_logprobs == full.token_logprobs[: len(gen.token_ids)]
        assert policy.decide(g_nll(gen.measured_logprobs))[1]
        assert gen.early == watch.decided()
        assert gen.early.tokens_saved == max_new - len(generated)
        # One definition: the answer reported is the decision's, decided_at_token tokens long.
        assert len(gen.token_ids) == gen.early.decided_at_token
        assert g_nll(gen.measured_logprobs) == pytest.approx(watch.rule.decision.g_nll)
    else:
        # Nothing decided: the row ran to its natural end with the same tokens.
        assert generated == natural


def test_a_held_whitespace_token_released_with_the_next_is_where_the_decision_falls(rules):
    """The white-space token decides; the token released with it is not part of the decided answer
    (in-process reported 47 tokens and their G-NLL for a decision at token 46)."""
    tok = ToyTokenizer()
    policy = AbstentionPolicy(mode="refuse", threshold=5.0)
    watch = EarlyStop(
        HeldText(tok.decode, rules.token_ids, rules.strings), policy.early_decision(), 30
    )
    assert not watch(1, -1.0)  # " a": G-NLL 1
    assert not watch(10, -10.0)  # " ": held back, not released yet
    assert watch(9, -0.5)  # " c" releases " " (G-NLL 11 > 5: decided there) and itself
    gen = watch.generation()
    assert gen.early is not None and gen.early.decided_at_token == 2
    assert gen.token_ids == [1, 10] and gen.text == "a"
    assert g_nll(gen.measured_logprobs) == pytest.approx(11.0)  # was 11.5, over three tokens
