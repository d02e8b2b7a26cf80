"""The typed early decision (:class:`gnll.backends.early.EarlyDecided`): one definition of the
fields every record writer takes, equal to the dict each writer used to spell itself."""

from __future__ import annotations

import json

from gnll.backends.base import Generation
from gnll.backends.early import EarlyDecided
from gnll.policy import add_early
from gnll.uncertainty import Uncertainty

EARLY = EarlyDecided(decided_at_token=3, tokens_generated=5, tokens_saved=45, action="refuse")


def test_the_record_fields_are_the_old_dicts_keys_values_and_order():
    # What gnll generate wrote per row and gnll serve's record carried before the type existed.
    old = {
        "early": True,
        "decided_at_token": 3,
        "tokens_generated": 5,
        "tokens_saved": 45,
        "g_nll_is_lower_bound": True,
    }
    assert list(EARLY.record().items()) == list(old.items())
    # a proxy's cut when the upstream's own limit applies: tokens_saved unknown
    assert EarlyDecided(2, 4, None).record()["tokens_saved"] is None


def test_a_served_record_with_an_early_decision_serialises_as_before():
    record = Uncertainty(
        decoding="greedy", nll=2.5, g_nll=2.5, p_correct=None, num_tokens=3, refused=True
    )
    old = record.model_copy(
        update={
            "early": True,
            "decided_at_token": 3,
            "tokens_generated": 5,
            "tokens_saved": 45,
            "g_nll_is_lower_bound": True,
            "withheld": "the rest of the answer: never generated",
        }
    )
    new = add_early(record, EARLY)
    assert json.dumps(new.to_json()) == json.dumps(old.to_json())


def test_a_generation_carries_it_and_one_without_keeps_its_old_dict():
    plain = Generation("Paris", [5], ["Paris"], [-0.1], "stop")
    assert "early" not in plain.to_dict()  # cached generations stay byte-identical
    stopped = Generation("Par", [5], ["Par"], [-3.0], "decided", early=EARLY)
    d = stopped.to_dict()
    assert d["early"] == {
        "decided_at_token": 3,
        "tokens_generated": 5,
        "tokens_saved": 45,
        "action": "refuse",
    }
    assert Generation.from_dict(json.loads(json.dumps(d))) == stopped
    assert Generation.from_dict(plain.to_dict()) == plain
