"""Reliability diagram of held-out (out-of-fold) predictions, with the count of answers per bin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gnll.calibration.metrics import calibration_bins

__all__ = ["reliability_diagram"]


def reliability_diagram(
    p: np.ndarray,
    y: np.ndarray,
    path: str | Path,
    *,
    bins: int = 10,
    title: str = "",
    metrics: dict[str, Any] | None = None,
) -> Path:
    """Write a PNG: observed frequency of correct answers against mean predicted P(correct).

    Two panels: equal-width bins (the ECE's binning) and equal-count bins (readable when the
    predictions crowd into a narrow range). Each point is labelled with its bin's count; the bars
    under each panel are the histogram of predictions.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        2, 2, figsize=(9, 5.2), gridspec_kw={"height_ratios": [3, 1]}, sharex="col"
    )
    for col, (strategy, label) in enumerate(
        (("uniform", "equal-width bins"), ("quantile", "equal-count bins"))
    ):
        ax, hist = axes[0, col], axes[1, col]
        table = calibration_bins(p, y, bins=bins, strategy=strategy)
        xs = [b["mean_p"] for b in table]
        ys = [b["freq"] for b in table]
        ax.plot([0, 1], [0, 1], color="grey", ls=":", lw=1, label="perfect calibration")
        ax.plot(xs, ys, "o-", color="black", label="held-out folds")
        for b in table:
            ax.annotate(
                str(b["count"]),
                (b["mean_p"], b["freq"]),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=7,
            )
        lim = 1.0 if strategy == "uniform" else min(1.0, max(max(xs + ys) * 1.15, 0.05))
        ax.set_xlim(0, lim)
        ax.set_ylim(0, lim)
        ax.set_ylabel("observed accuracy")
        ax.set_title(f"{label} ({bins})", fontsize=9)
        ax.legend(loc="upper left", fontsize=7)
        hist.hist(p, bins=np.linspace(0, lim, 31), color="grey")
        hist.set_xlabel("predicted P(correct)")
        hist.set_ylabel("answers")
    if metrics:
        text = "   ".join(
            f"{k}={metrics[k]:.3f}"
            for k in ("ece", "ece_adaptive", "brier", "log_loss", "auroc")
            if isinstance(metrics.get(k), float)
        )
        fig.text(0.5, 0.005, text, ha="center", fontsize=8)
    fig.suptitle(title or "Reliability diagram", fontsize=10)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
