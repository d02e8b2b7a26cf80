"""Figures of a run (matplotlib, Agg backend, PNG): ROC curves, accuracy-vs-rejection curves,
and AUROC against the number of generated tokens per question (what each measure costs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gnll import measures as M
from gnll.evaluation.results.metrics import accuracy_curve
from gnll.evaluation.results.report import read_rows

__all__ = ["make_plots"]


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
    from matplotlib.ticker import NullFormatter, ScalarFormatter
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
    panels = [(t, m, r) for t, tr in results["tasks"].items() for m, r in tr["metrics"].items()]
    if panels:
        cols = min(3, len(panels))
        nrows = (len(panels) + cols - 1) // cols
        fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.8 * nrows), squeeze=False)
        for ax, (task, metric, mres) in zip(axes.flat, panels, strict=False):
            shown = 0
            for m, v in mres["measures"].items():
                if v.get("auroc") is None or not v.get("mean_tokens"):
                    continue
                shown += 1
                ax.scatter(
                    v["mean_tokens"],
                    v["auroc"],
                    s=40 if m == "g-nll" else 22,
                    color="black" if m == "g-nll" else None,
                    zorder=5 if m == "g-nll" else 3,
                )
                ax.annotate(
                    M.get(m).label,
                    (v["mean_tokens"], v["auroc"]),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
            if not shown:
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
                ax.set(title=f"{task} · {metric}", xticks=[], yticks=[])
                ax.title.set_fontsize(9)
                continue
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set(
                xlabel="generated tokens per question", ylabel="AUROC", title=f"{task} · {metric}"
            )
            ax.title.set_fontsize(9)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(panels) :]:
            ax.axis("off")
        fig.suptitle(f"{results['model']}: AUROC vs. generation cost", fontsize=10)
        fig.tight_layout()
        p = out / "cost_auroc.png"
        fig.savefig(p, dpi=120)
        plt.close(fig)
        written.append(p)
    return written
