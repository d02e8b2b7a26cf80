"""The KV-cache keyword of ``forward`` is looked up, not assumed: transformers 5.24 renamed
``past_key_values`` to ``cache``, and a hard-coded name silently sent every model to the slow
``generate`` path (the loop's speed-ups lost, outputs unchanged)."""

from __future__ import annotations

import types

import pytest
from transformers import LlamaConfig

from gnll.backends.hf.kv_cache import cache_argument, plain_cache


def fake_model(forward):
    config = LlamaConfig(num_hidden_layers=2, hidden_size=16, num_attention_heads=2, vocab_size=32)
    return types.SimpleNamespace(forward=forward, config=config)


def new_style(input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=None): ...


def old_style(input_ids, attention_mask=None, position_ids=None, past_key_values=None): ...


def both(input_ids, attention_mask=None, position_ids=None, cache=None, past_key_values=None): ...


def neither(input_ids, attention_mask=None, position_ids=None): ...


@pytest.mark.parametrize(
    ("forward", "expected"),
    [(new_style, "cache"), (old_style, "past_key_values"), (both, "cache"), (neither, None)],
)
def test_cache_argument_follows_the_signature(forward, expected):
    assert cache_argument(fake_model(forward)) == expected


@pytest.mark.parametrize(
    ("forward", "ok"), [(new_style, True), (old_style, True), (neither, False)]
)
def test_plain_cache_accepts_either_name(forward, ok):
    assert plain_cache(fake_model(forward)) is ok
