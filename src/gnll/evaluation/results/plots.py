"""Figures of a run (matplotlib, Agg backend, PNG): ROC curves, accuracy-vs-rejection curves,
and AUROC against the number of generated tokens per question (what each measure costs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gnll import measures as M
from gnll.evaluation.results.metrics import accuracy_curve
from gnll.evaluation.results.report import read_rows

__all__ = ["cost_figure", "make_plots"]


def _style(m: str) -> dict[str, Any]:
    if m == "g-nll":
        return {"color": "black", "lw": 2.2, "zorder": 5}
    if m in ("ln-g-nll", "bs-msp"):
        return {"lw": 1.4, "ls": "--"}
    return {"lw": 1.2}


def make_plots(
    samples_path: str | Path, results: dict[str, Any], out_dir: str | Path
) -> list[Path]:
    """Write ``roc_<task>_<metric>.png``, ``rejection_<task>_<metric>.png``, ``cost_auroc.png``."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from sklearn.metrics import roc_curve

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = read_rows(samples_path)
    written: list[Path] = []
    for task, tres in results["tasks"].items():
        trs = rows.get(task, [])
        for metric, mres in tres["metrics"].items():
            keep = [r for r in trs if r["correct"].get(metric) is not None]
            if not keep:
                continue
            c = np.array([float(r["correct"][metric]) for r in keep])
            names = [m for m in M.ORDER if m in mres["measures"]]
            title = f"{results['model']} · {task} · {metric} (n={len(keep)}, acc={c.mean():.2f})"

            if 0 < c.sum() < len(c):
                fig, ax = plt.subplots(figsize=(5.5, 5))
                for m in names:
                    s = np.array([r["measures"][m] for r in keep])
                    fpr, tpr, _ = roc_curve((c < 0.5).astype(int), s)
                    a = mres["measures"][m]["auroc"]
                    ax.plot(fpr, tpr, label=f"{M.get(m).label} ({a:.3f})", **_style(m))
                ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls=":")
                ax.set(
                    xlabel="false positive rate",
                    ylabel="true positive rate (incorrect detected)",
                    title=title,
                )
                ax.title.set_fontsize(8)
                ax.legend(fontsize=7, loc="lower right")
                p = out / f"roc_{task}_{metric}.png"
                fig.tight_layout()
                fig.savefig(p, dpi=120)
                plt.close(fig)
                written.append(p)

            fig, ax = plt.subplots(figsize=(5.5, 4.2))
            frac = np.arange(1, len(c) + 1) / len(c)
            for m in names:
                s = np.array([r["measures"][m] for r in keep])
                ax.plot(frac, accuracy_curve(c, s), label=M.get(m).label, **_style(m))
            ax.axhline(c.mean(), color="grey", lw=0.8, ls=":", label="no rejection")
            ax.axvline(0.8, color="grey", lw=0.6, ls="--")
            ax.set(
                xlabel="fraction of answers kept (least uncertain first)",
                ylabel="accuracy",
                title=title,
            )
            ax.title.set_fontsize(8)
            ax.legend(fontsize=7)
            p = out / f"rejection_{task}_{metric}.png"
            fig.tight_layout()
            fig.savefig(p, dpi=120)
            plt.close(fig)
            written.append(p)

    # Cost/quality: AUROC against generated tokens per question, one panel per task x metric.
    fig = cost_figure(results)
    if fig is not None:
        p = out / "cost_auroc.png"
        fig.savefig(p, dpi=120)
        plt.close(fig)
        written.append(p)
    return written


#: Points of vertical space between two stacked point labels of the cost figure (7 pt text).
LABEL_GAP = 9.0


def _log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks covering [lo, hi], at least two (a range within one decade would get none from
    matplotlib's major locator and show a bare log axis).

    >>> _log_ticks(3.2, 8.9), _log_ticks(4, 400)
    ([5.0], [5.0, 10.0, 20.0, 50.0, 100.0, 200.0])
    """
    ticks = []
    for exp in range(int(np.floor(np.log10(lo))) - 1, int(np.ceil(np.log10(hi))) + 1):
        for m in (1, 2, 5):
            t = m * 10.0**exp
            if lo <= t <= hi:
                ticks.append(t)
    return ticks


def _label_points(ax: Any, points: list[tuple[str, float, float]]) -> None:
    """Label each point; labels of points at the same cost are stacked so they never overlap."""
    fig = ax.figure
    by_x: dict[float, list[tuple[str, float, float]]] = {}
    for label, x, y in points:
        by_x.setdefault(round(x, 6), []).append((label, x, y))
    to_pts = 72.0 / fig.dpi
    for group in by_x.values():
        group.sort(key=lambda p: -p[2])
        prev = None
        for label, x, y in group:
            py = ax.transData.transform((x, y))[1] * to_pts  # the point's height, in points
            ty = py if prev is None else min(py, prev - LABEL_GAP)
            prev = ty
            ax.annotate(
                label,
                (x, y),
                fontsize=7,
                xytext=(5, ty - py),
                textcoords="offset points",
                va="center",
                arrowprops=None if ty == py else {"arrowstyle": "-", "lw": 0.4, "color": "grey"},
            )


def cost_figure(results: dict[str, Any]) -> Any:
    """AUROC against generated tokens per question, one panel per task x metric (``None``: no
    panels). The x axis is logarithmic with labelled 1-2-5 ticks; labels of measures that cost
    the same (all the sampling-based ones) are stacked beside their points."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    panels = [(t, m, r) for t, tr in results["tasks"].items() for m, r in tr["metrics"].items()]
    if not panels:
        return None
    cols = min(3, len(panels))
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.8 * nrows), squeeze=False)
    labelled = []
    for ax, (task, metric, mres) in zip(axes.flat, panels, strict=False):
        points = [
            (M.get(m).label, float(v["mean_tokens"]), float(v["auroc"]))
            for m, v in mres["measures"].items()
            if v.get("auroc") is not None and v.get("mean_tokens")
        ]
        ax.set_title(f"{task} · {metric}", fontsize=9)
        if not points:
            # An empty frame would read as a plotting bug: say why there is nothing to show.
            ax.text(
                0.5,
                0.5,
                f"AUROC undefined\n(accuracy {mres.get('accuracy', float('nan')):.3f}: "
                "one correctness class)",
                ha="center",
                va="center",
                transform=ax.transAxes,
                fontsize=8,
            )
            ax.set(xticks=[], yticks=[])
            continue
        for label, x, y in points:
            gnll = label == M.get("g-nll").label
            ax.scatter(
                x, y, s=40 if gnll else 22, color="black" if gnll else None, zorder=6 if gnll else 5
            )
        xs = [p[1] for p in points]
        ys = [p[2] for p in points]
        lo, hi = min(xs) / 1.5, max(xs) * 2.5  # room on the right for the labels
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        span = max(max(ys) - min(ys), 0.05)
        ax.set_ylim(min(ys) - 0.15 * span, max(ys) + 0.15 * span)
        ticks = _log_ticks(lo, hi)
        if len(ticks) < 2:
            ticks = sorted({*ticks, float(f"{min(xs):.2g}"), float(f"{max(xs):.2g}")})
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xticklabels([f"{t:g}" for t in ticks])
        ax.set(xlabel="generated tokens per question", ylabel="AUROC")
        ax.grid(alpha=0.3)
        labelled.append((ax, points))
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"{results['model']}: AUROC vs. generation cost", fontsize=10)
    fig.tight_layout()
    for ax, points in labelled:  # after the layout: label spacing is measured on the final axes
        _label_points(ax, points)
    return fig
