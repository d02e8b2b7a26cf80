"""Trace measures for reasoning models: DeepConf's confidence over the *trace*, not the answer.

DeepConf (Fu et al., 2025, "Deep Think with Confidence") scores a reasoning trace by how confident
the model was while writing it, to weight or filter traces in a majority vote:

* **token confidence** ``C_i = -mean_j log p_j`` over the ``k`` most likely tokens reported at
  position ``i`` (higher = a peaked distribution = more confident);
* **group confidence**: the mean token confidence over a sliding window of ``window`` tokens
  (2048 in the paper);
* per trace: the **lowest group** confidence, the **tail** confidence (the last ``window``
  tokens), and the **bottom-10%** group confidence (the mean of the lowest 10% of groups).

These measure the quality of a trace for voting among several traces. They are not the answer's
uncertainty: G-NLL of the answer (conditioned on the trace) is. gnll reports them beside G-NLL,
named as trace measures, for users who vote over traces.

Examples
--------
>>> conf = token_confidence([[-0.1, -2.0], [-0.5, -1.0], [-3.0, -3.1]])
>>> [round(float(c), 3) for c in conf]
[1.05, 0.75, 3.05]
>>> t = trace_confidence(conf, window=2)
>>> round(t["lowest_group"], 3), round(t["tail"], 3), round(t["bottom_10pct"], 3)
(0.9, 1.9, 0.9)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["DEEPCONF_WINDOW", "group_confidence", "token_confidence", "trace_confidence"]

#: DeepConf's group (and tail) window, in tokens.
DEEPCONF_WINDOW = 2048


def token_confidence(top_logprobs: Sequence[Sequence[float]]) -> np.ndarray:
    """DeepConf's token confidence: minus the mean log-prob of the alternatives reported at each
    position (the chosen token's own log-prob when only it is known, ``k = 1``).

    Raises
    ------
    ValueError
        A position without any log-prob, or a log-prob that is not finite.
    """
    out = np.empty(len(top_logprobs), dtype=np.float64)
    for i, alts in enumerate(top_logprobs):
        values = [float(v) for v in alts]
        if not values:
            raise ValueError(f"token {i} has no log-prob: its confidence is undefined")
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"token {i} has a log-prob that is not finite: {values}")
        out[i] = -math.fsum(values) / len(values)
    return out


def group_confidence(confidence: Sequence[float], window: int = DEEPCONF_WINDOW) -> np.ndarray:
    """Sliding-window means of the token confidences (one group, the mean, when the trace is
    shorter than ``window``).

    >>> group_confidence([1.0, 2.0, 3.0, 4.0], window=2).tolist()
    [1.5, 2.5, 3.5]
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    c = np.asarray(confidence, dtype=np.float64)
    if c.size == 0:
        return c
    if c.size <= window:
        return np.array([c.mean()])
    sums = np.cumsum(np.concatenate([[0.0], c]))
    return (sums[window:] - sums[:-window]) / window


def trace_confidence(
    confidence: Sequence[float], *, window: int = DEEPCONF_WINDOW, bottom: float = 0.1
) -> dict[str, Any]:
    """A trace's DeepConf scores from its token confidences (``None`` values for an empty trace).

    ``lowest_group``: the least confident window; ``tail``: the mean over the last ``window``
    tokens; ``bottom_10pct``: the mean of the lowest ``bottom`` fraction of groups (at least one).
    """
    groups = group_confidence(confidence, window)
    if groups.size == 0:
        return {"lowest_group": None, "tail": None, "bottom_10pct": None, "window": window}
    c = np.asarray(confidence, dtype=np.float64)
    low = np.sort(groups)[: max(1, int(len(groups) * bottom))]
    return {
        "lowest_group": float(groups.min()),
        "tail": float(c[-window:].mean()),
        "bottom_10pct": float(low.mean()),
        "window": window,
    }
