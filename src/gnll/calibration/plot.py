"""Reliability diagram of held-out (out-of-fold) predictions, with the count of answers per bin."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gnll.calibration.cascade import (
    CascadeData,
    CascadeThreshold,
    cascade_curve,
    random_accuracy_at_rate,
)
from gnll.calibration.metrics import calibration_bins

__all__ = ["cascade_plot", "reliability_diagram"]


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


def cascade_plot(
    data: CascadeData, path: str | Path, *, fitted: CascadeThreshold | None = None
) -> Path:
    """PNG: cascade accuracy against escalation rate, gated by the score and at random."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = cascade_curve(data.scores, data.small, data.large)
    rates = np.linspace(0, 1, 101)
    rand = [random_accuracy_at_rate(data.small, data.large, r) for r in rates]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.step(curve["escalation_rate"], curve["accuracy"], where="post", label="gated by the score")
    ax.plot(rates, rand, "--", color="grey", label="random escalation (expected)")
    if fitted is not None:
        ax.axhline(fitted.target, color="tab:red", lw=0.8, label=f"target {fitted.target:g}")
        ax.plot([fitted.escalation_rate], [fitted.accuracy], "o", color="tab:red")
    ax.set_xlabel("escalation rate (fraction of questions sent to the large model)")
    ax.set_ylabel("cascade accuracy")
    ax.set_title(
        f"{data.small_model or 'small'} -> {data.large_model or 'large'} (n={len(data.keys)})"
    )
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
