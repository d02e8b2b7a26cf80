"""Batch planning: which prompts share a batch and which rows share a prefill pass (pure Python).

Both plans trade padding against the fixed cost of an extra forward pass; neither touches torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Shared prompt prefixes shorter than this are not worth a separate forward pass and cache copy.
MIN_SHARED_PREFIX = 16

#: The fixed cost of one extra forward pass, in prompt positions (reading every weight once costs
#: about as much as running ~20 positions through a small model on CPU). Prefill groups are chosen
#: with it: see :func:`prefill_groups`.
FORWARD_COST_POSITIONS = 24

#: Finished rows are dropped from the batch (one copy of the KV cache) once they are at least this
#: fraction of the live rows; until then they ride along, which costs one position each per step.
COMPACT_FRACTION = 1 / 8


def pack_batches(
    lengths: Sequence[int],
    *,
    max_prompts: int,
    rows_per_prompt: int = 1,
    extra: int = 0,
    max_tokens: int | None = None,
) -> list[list[int]]:
    """Cut prompts (sorted longest first) into consecutive batches under a row and a token budget.

    A batch of prompts ``i..j`` holds ``(j - i + 1) x rows_per_prompt`` rows whose cache reaches
    ``lengths[i] + extra`` positions; it is closed before that product would exceed ``max_tokens``.
    A prompt that alone exceeds the budget still gets a batch of its own.

    >>> pack_batches([300, 200, 100, 100], max_prompts=3, extra=20, max_tokens=700)
    [[0, 1], [2, 3]]
    >>> pack_batches([300, 200, 100, 100], max_prompts=3)
    [[0, 1, 2], [3]]
    """
    if any(a < b for a, b in zip(lengths, lengths[1:], strict=False)):
        raise ValueError("pack_batches needs lengths sorted longest first")
    batches: list[list[int]] = []
    for i in range(len(lengths)):
        if batches:
            cur = batches[-1]
            rows = (len(cur) + 1) * rows_per_prompt
            within = max_tokens is None or rows * (lengths[cur[0]] + extra) <= max_tokens
            if len(cur) < max_prompts and within:
                cur.append(i)
                continue
        batches.append([i])
    return batches


def prefill_groups(
    lengths: Sequence[int], forward_cost: float = FORWARD_COST_POSITIONS
) -> list[list[int]]:
    """Split rows into prefill groups so that padding does not cost more than extra forwards.

    A batch prefilled in one forward pass is padded to its longest row, so a batch whose prompt
    suffixes are 20 to 60 tokens long runs twice the positions it needs. Rows sorted by length are cut
    into contiguous groups minimising ``sum(group size x longest in group) + forward_cost x groups``
    (exact dynamic programme, O(rows^2)).

    Returns lists of row indices, longest rows first.

    >>> prefill_groups([5, 60, 58, 6, 59, 4], forward_cost=24)
    [[1, 4, 2], [3, 0, 5]]
    >>> prefill_groups([30, 31, 29], forward_cost=24)
    [[1, 0, 2]]
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    sizes = [lengths[i] for i in order]
    n = len(sizes)
    best = [0.0] + [float("inf")] * n  # best[j]: cost of the first j sorted rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):  # rows i..j-1 form the last group; sizes[i] is its longest
            c = best[i] + (j - i) * sizes[i] + forward_cost
            if c < best[j]:
                best[j], cut[j] = c, i
    groups: list[list[int]] = []
    j = n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure (torch's CUDA/MPS OOM or the CPU allocator's)."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


def halving_on_oom(run: Callable[[list[T]], list[R]], batch: list[T]) -> list[R]:
    """``run(batch)``; on an out-of-memory error, run each half (recursively) before giving up.

    A single item that does not fit re-raises the error. Outputs keep the order of ``batch``.

    >>> def run(b):
    ...     if len(b) > 2:
    ...         raise MemoryError
    ...     return [x * 10 for x in b]
    >>> halving_on_oom(run, [1, 2, 3, 4, 5])
    [10, 20, 30, 40, 50]
    """
    try:
        return run(batch)
    except Exception as exc:
        if len(batch) < 2 or not is_out_of_memory(exc):
            raise
    half = len(batch) // 2
    return halving_on_oom(run, batch[:half]) + halving_on_oom(run, batch[half:])


def common_length(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """How many leading tokens ``a`` and ``b`` share, at most ``limit``.

    >>> common_length([1, 2, 3, 4], [1, 2, 9], 10)
    2
    """
    n = 0
    while n < limit and n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n
