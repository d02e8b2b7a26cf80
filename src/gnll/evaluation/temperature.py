"""Choosing the sampling temperature on the held-out pool (the paper's protocol).

The candidate with the best mean AUROC of the sampling-based measures under the primary correctness
metric wins (the first of ties); a pool with a single correctness class falls back to 1.0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gnll.evaluation.config import EvalConfig
from gnll.evaluation.metrics import auroc

__all__ = ["choose_temperature", "heldout_size"]


def heldout_size(cfg: EvalConfig, available: int) -> int:
    """How many held-out questions choose the temperature (``--heldout_size``, else
    ``min(100, limit)``), bounded by the ``available`` pool."""
    wanted = cfg.heldout_size if cfg.heldout_size is not None else min(100, cfg.limit or 100)
    n = min(wanted, available)
    if n < 2:
        raise ValueError(
            "temperature selection needs a held-out pool; give --temperature or --heldout_size >= 2"
        )
    return n


def choose_temperature(
    candidates: Sequence[float],
    records: Mapping[float, Iterable[dict[str, Any]]],
    metric: str,
    measures: Sequence[str],
) -> tuple[float, dict[str, Any]]:
    """The best of ``candidates`` and the table it was chosen from.

    ``records[t]`` are the held-out ``samples.jsonl``-style records at temperature ``t`` (with
    ``correctness`` and ``measures``); questions whose ``metric`` verdict is undecided are left out.
    """
    table: dict[str, Any] = {}
    for temp in candidates:
        correct: list[float] = []
        scores: dict[str, list[float]] = {m: [] for m in measures}
        for r in records[temp]:
            c = r["correctness"][metric]["correct"]
            if c is None:
                continue
            correct.append(float(c))
            for m in measures:
                scores[m].append(r["measures"][m])
        aucs = {m: auroc(correct, scores[m]) if correct else float("nan") for m in measures}
        finite = [a for a in aucs.values() if not math.isnan(a)]
        table[f"{temp:g}"] = {
            "auroc": aucs,
            "mean_auroc": sum(finite) / len(finite) if finite else float("nan"),
            "n": len(correct),
            "accuracy": sum(correct) / len(correct) if correct else float("nan"),
        }
    finite_t = [t for t in candidates if not math.isnan(table[f"{t:g}"]["mean_auroc"])]
    if finite_t:
        best = max(finite_t, key=lambda t: table[f"{t:g}"]["mean_auroc"])  # first of ties
        note = "best mean AUROC of the sampling-based measures on the held-out pool"
    else:
        best = 1.0 if 1.0 in candidates else candidates[0]
        note = "held-out pool has a single correctness class; fell back to the default temperature"
    return best, {"candidates": table, "note": note}
