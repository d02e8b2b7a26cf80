"""Batch planning of the hf backend, without a model: prefill groups, token-budget batches, and
halving a batch that ran out of memory (the loop tests that use them on a real model:
test_backend_fast.py, test_reliability_memory.py)."""

from __future__ import annotations

import numpy as np
import pytest

from gnll.backends.hf.planning import halving_on_oom, is_out_of_memory


def test_prefill_groups_cover_every_row_once():
    from gnll.backends.hf import prefill_groups

    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = rng.integers(1, 80, size=rng.integers(1, 40)).tolist()
        groups = prefill_groups(lengths)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        cost = sum(len(g) * max(lengths[i] for i in g) + 24 for g in groups)
        assert cost <= len(lengths) * max(lengths) + 24  # never worse than one padded pass
    # Equal lengths: splitting only adds forwards.
    assert len(prefill_groups([30] * 16)) == 1
    # Far apart: two groups.
    assert [sorted(g) for g in prefill_groups([60] * 8 + [5] * 8)] == [
        list(range(8)),
        list(range(8, 16)),
    ]


def test_pack_batches_respects_rows_and_tokens():
    from gnll.backends.hf import pack_batches

    lengths = [250, 240, 120, 100, 90, 10]
    batches = pack_batches(lengths, max_prompts=4, rows_per_prompt=2, extra=50, max_tokens=1200)
    assert sorted(i for b in batches for i in b) == list(range(6))
    for b in batches:
        assert len(b) <= 4 and b == list(range(b[0], b[-1] + 1))
        assert len(b) == 1 or len(b) * 2 * (lengths[b[0]] + 50) <= 1200
    # A prompt larger than the whole budget still runs, alone.
    assert pack_batches([5000, 10], max_prompts=8, max_tokens=100) == [[0], [1]]
    with pytest.raises(ValueError, match="sorted longest first"):
        pack_batches([1, 2], max_prompts=2)


def test_halving_helpers():
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    with pytest.raises(RuntimeError, match="shape"):
        halving_on_oom(lambda b: (_ for _ in ()).throw(RuntimeError("shape mismatch")), [1, 2])
