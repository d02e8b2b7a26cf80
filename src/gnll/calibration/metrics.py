"""How good probabilities of being correct are: ECE (with its binning), Brier score, log-loss, AUROC.

Conventions: ``p`` is a predicted probability that the answer is correct, ``y`` is 1 for a correct
answer and 0 otherwise.

Examples
--------
>>> import numpy as np
>>> p = np.array([0.1, 0.1, 0.9, 0.9]); y = np.array([0, 0, 1, 1])
>>> round(brier_score(p, y), 3)
0.01
>>> round(expected_calibration_error(p, y, bins=10, strategy="uniform"), 6)
0.1
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from gnll._util.validation import check_scores_labels

__all__ = [
    "CLIP",
    "brier_score",
    "calibration_bins",
    "expected_calibration_error",
    "log_loss",
    "probability_metrics",
]

#: Probabilities are kept inside [CLIP, 1 - CLIP] wherever a log is taken, so one confidently wrong
#: prediction costs a large but finite log-loss.
CLIP = 1e-4

BinStrategy = Literal["uniform", "quantile"]


def _check(p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return check_scores_labels(p, y, names=("p", "y"), probabilities=True)


def calibration_bins(
    p: np.ndarray, y: np.ndarray, *, bins: int = 10, strategy: BinStrategy = "uniform"
) -> list[dict[str, Any]]:
    """Per-bin mean prediction, observed frequency and count (empty bins are left out).

    ``"uniform"``: ``bins`` equal-width bins on [0, 1] (right edge closed for the last bin);
    ``"quantile"``: ``bins`` bins with (nearly) equal numbers of predictions, cut at quantiles of
    ``p`` -- informative when predictions crowd into a narrow range (e.g. a weak model whose
    probabilities of being correct are all small).
    """
    p, y = _check(p, y)
    if strategy == "uniform":
        edges = np.linspace(0.0, 1.0, bins + 1)
    elif strategy == "quantile":
        edges = np.unique(np.quantile(p, np.linspace(0.0, 1.0, bins + 1)))
        if len(edges) < 2:  # every prediction the same (a flat map): one bin, not none
            edges = np.array([0.0, 1.0])
        edges[0], edges[-1] = 0.0, 1.0
    else:
        raise ValueError(f"strategy must be 'uniform' or 'quantile', got {strategy!r}")
    idx = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, len(edges) - 2)
    out = []
    for b in range(len(edges) - 1):
        m = idx == b
        n = int(m.sum())
        if n:
            out.append(
                {
                    "lo": float(edges[b]),
                    "hi": float(edges[b + 1]),
                    "count": n,
                    "mean_p": float(p[m].mean()),
                    "freq": float(y[m].mean()),
                }
            )
    return out


def expected_calibration_error(
    p: np.ndarray, y: np.ndarray, *, bins: int = 10, strategy: BinStrategy = "uniform"
) -> float:
    """ECE: count-weighted mean over bins of ``|mean prediction - observed frequency|``."""
    table = calibration_bins(p, y, bins=bins, strategy=strategy)
    n = sum(b["count"] for b in table)
    return float(sum(b["count"] * abs(b["mean_p"] - b["freq"]) for b in table) / n)


def brier_score(p: np.ndarray, y: np.ndarray) -> float:
    """Mean squared difference between prediction and outcome."""
    p, y = _check(p, y)
    return float(np.mean((p - y) ** 2))


def log_loss(p: np.ndarray, y: np.ndarray) -> float:
    """Mean negative log-likelihood of the outcomes (predictions clipped to [CLIP, 1 - CLIP])."""
    p, y = _check(p, y)
    q = np.clip(p, CLIP, 1 - CLIP)
    return float(-np.mean(y * np.log(q) + (1 - y) * np.log1p(-q)))


def probability_metrics(p: np.ndarray, y: np.ndarray, *, bins: int = 10) -> dict[str, Any]:
    """All metrics of :mod:`gnll.calibration.metrics`, with the binning stated next to the ECEs.

    ``auroc`` is that of ``p`` for telling correct from incorrect answers (NaN with one class); it
    equals the AUROC of the uncertainty score itself wherever the map is strictly monotone (ties
    created by a step-shaped isotonic map can lower it a little).
    """
    from sklearn.metrics import roc_auc_score

    p, y = _check(p, y)
    auroc = float(roc_auc_score(y, p)) if 0 < y.sum() < len(y) else float("nan")
    return {
        "n": len(y),
        "accuracy": float(y.mean()),
        "ece": expected_calibration_error(p, y, bins=bins, strategy="uniform"),
        "ece_binning": f"{bins} equal-width bins on [0, 1]",
        "ece_adaptive": expected_calibration_error(p, y, bins=bins, strategy="quantile"),
        "ece_adaptive_binning": f"{bins} equal-count bins (quantiles of the predictions)",
        "brier": brier_score(p, y),
        "log_loss": log_loss(p, y),
        "auroc": auroc,
    }
