"""Every seed gnll derives, in one place, each recipe named after what it seeds.

The formulas are frozen: cached runs and byte-identical resume depend on each recipe giving the
numbers it always gave (``tests/util/test_seeds.py`` pins known values). A new use gets a new name here,
never a changed formula.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["derive_seed", "request_seed", "sample_seed", "seed_from", "stable_hash"]


def sample_seed(seed: int | None, prompt: str | Sequence[int], index: int) -> int:
    """The seed of sample ``index`` of ``prompt``: a function of its identity only.

    ``prompt`` is the text or the token ids the model conditions on. Every backend seeds sample
    ``index`` of a prompt with this number, so samples do not depend on how prompts are batched or
    ordered (a prompt repeated within one call gets the same samples each time).

    >>> sample_seed(0, [1, 2, 3], 0) == sample_seed(0, [1, 2, 3], 0) != sample_seed(0, [1, 2, 3], 1)
    True
    >>> 0 <= sample_seed(None, "Capital of France?", 4) < 2**63
    True
    """
    h = hashlib.sha256(f"gnll-sample|{0 if seed is None else int(seed)}|{int(index)}|".encode())
    if isinstance(prompt, str):
        h.update(b"text|" + prompt.encode("utf-8"))
    else:
        h.update(b"ids|" + np.asarray(prompt, dtype=np.int64).tobytes())
    return int.from_bytes(h.digest()[:8], "little") >> 1


def request_seed(seed: int, offset: int, prompt: str) -> int:
    """The ``seed`` of a server request for the samples of ``prompt`` starting at ``offset``.

    From the prompt's text, not its position, so a resumed or re-batched run draws the same; 31
    bits, which every OpenAI-compatible server accepts.
    """
    key = f"{seed}\x00{offset}\x00{prompt}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "big") >> 1


def stable_hash(obj: Any, n: int = 12) -> str:
    """A short hash of a JSON-able object, independent of dict order (names cache files)."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def derive_seed(*parts: Any) -> int:
    """A 31-bit seed from any parts (the evaluation's sampling stages: seed, task, split, T)."""
    return int(stable_hash([str(p) for p in parts], 8), 16) & 0x7FFFFFFF


def seed_from(*parts: Any) -> int:
    """A 32-bit seed from ``"|"``-joined parts: data splits, few-shot draws, bootstrap strata.

    >>> seed_from(0, "k") == seed_from("0|k")
    True
    """
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little")
