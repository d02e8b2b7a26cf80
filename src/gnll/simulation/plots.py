"""Figures of the simulation study (PNG, matplotlib ``Agg``): Fig. 1a/1b, Fig. 3 and the App. C grids.

Fig. 3 shows example next-token distributions drawn from the App. C Dirichlet model (``|V|`` = 20
and 100); it depends only on the seed, not on the study's results.

All panels plot the *error* ``estimate - exact`` against ``N`` because every draw has its own
``p(y)`` (and therefore its own exact value); the paper's appendix plots one fixed ``p`` per panel,
where estimate and error differ only by a constant.

Example
-------
>>> from gnll.simulation.study import StudyConfig, run_study
>>> res = run_study(StudyConfig.quick(workers=1, distributions=4, theory_distributions=0))
>>> import tempfile; paths = make_figures(res, tempfile.mkdtemp())
>>> sorted(p.name for p in paths)[:2]
['fig1a_entropy.png', 'fig1b_max.png']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = [
    "FIGURE_FILES",
    "main_setting",
    "make_figures",
    "next_token_examples",
    "plot_next_token_examples",
    "plot_entropy_panel",
    "plot_found_max_panel",
    "plot_max_panel",
]

FIGURE_FILES = {
    "fig1a": "fig1a_entropy.png",
    "fig1b": "fig1b_max.png",
    "fig3": "fig3_dirichlet_next_tokens.png",
    "fig4": "fig4_entropy_grid.png",
    "fig4_quantiles": "fig4_entropy_grid_quantiles.png",
    "fig5": "fig5_max_grid.png",
    "found_max": "found_max_fraction.png",
}

_BEAM_COLOR = "black"


def _label(name: str, est: dict[str, Any]) -> str:
    if est["method"] == "beam":
        return "beam search (N=1: greedy)"
    if "naive" in name:
        return f"MS tau={est['temperature']:g}, no IS weights"
    return f"MS tau={est['temperature']:g}"


def _colors(n: int) -> list:
    cmap = plt.get_cmap("viridis")
    return [cmap(x) for x in np.linspace(0.1, 0.85, max(n, 1))]


def plot_entropy_panel(
    ax: Any, setting: dict[str, Any], *, legend: bool = True, quantiles: bool = False
) -> None:
    """PE error vs ``N``, one curve per MS temperature (and per weighting).

    Default (the paper's style): mean (line) +- one std (shade) on a symlog axis, so the ``tau=1``
    band (about +-1 nat) stays visible next to the heavy-tailed importance-weighted ``tau<1`` one.
    ``quantiles=True``: median (line) and 5-95% quantiles (shade) on a linear axis.
    """
    ests = [(n, e) for n, e in setting["estimators"].items() if e["target"] == "entropy"]
    for (name, e), c in zip(ests, _colors(len(ests)), strict=True):
        n = np.asarray(e["n"])
        err = e["error"]
        if quantiles:
            mid, lo, hi = (np.asarray(err[k]) for k in ("q50", "q05", "q95"))
        else:
            mid, std = np.asarray(err["mean"]), np.asarray(err["std"])
            lo, hi = mid - std, mid + std
        ls = "--" if "naive" in name else "-"
        ax.plot(n, mid, color=c, label=_label(name, e), lw=1.8, ls=ls)
        ax.fill_between(n, lo, hi, color=c, alpha=0.2, lw=0)
    ax.axhline(0.0, color="grey", lw=0.8, ls="--")
    if not quantiles:
        ax.set_yscale("symlog", linthresh=1.0)
    ax.set_xlabel("number of samples N")
    ax.set_ylabel(r"$\hat{H} - H(p)$ [nats]")
    ax.set_title(f"|V|={setting['vocab_size']}, T={setting['length']}")
    if legend:
        ax.legend(fontsize=8)


def _entropy_quantile_panel(ax: Any, setting: dict[str, Any], *, legend: bool = True) -> None:
    plot_entropy_panel(ax, setting, legend=legend, quantiles=True)


def plot_max_panel(ax: Any, setting: dict[str, Any], *, legend: bool = True) -> None:
    """``M`` error vs ``N``: median (line), 5-95% quantiles (shade); beam search and MS per tau."""
    ests = [(n, e) for n, e in setting["estimators"].items() if e["target"] == "min_entropy"]
    ms = [(n, e) for n, e in ests if e["method"] == "ms"]
    colors = dict(zip([n for n, _ in ms], _colors(len(ms)), strict=True))
    colors["m_beam"] = _BEAM_COLOR
    for name, e in ests:
        n = np.asarray(e["n"])
        c = colors[name]
        beam = e["method"] == "beam"
        ax.plot(
            n,
            e["error"]["q50"],
            color=c,
            label=_label(name, e),
            lw=2.2 if beam else 1.6,
            ls="-" if beam else "-.",
            zorder=3 if beam else 2,
        )
        ax.fill_between(n, e["error"]["q05"], e["error"]["q95"], color=c, alpha=0.15, lw=0)
    ax.axhline(0.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("N (samples; beam width)")
    ax.set_ylabel(r"$\hat{M} - M(p)$ [nats]")
    ax.set_title(f"|V|={setting['vocab_size']}, T={setting['length']}")
    if legend:
        ax.legend(fontsize=8)


def plot_found_max_panel(ax: Any, setting: dict[str, Any], *, legend: bool = True) -> None:
    """Fraction of draws whose ``M`` estimate equals the exact maximum, vs ``N``."""
    ests = [(n, e) for n, e in setting["estimators"].items() if e["target"] == "min_entropy"]
    ms = [n for n, e in ests if e["method"] == "ms"]
    colors = dict(zip(ms, _colors(len(ms)), strict=True))
    colors["m_beam"] = _BEAM_COLOR
    for name, e in ests:
        ax.plot(
            e["n"],
            e["found_max_fraction"],
            color=colors[name],
            label=_label(name, e),
            marker="o",
            ms=3,
            lw=1.5,
        )
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("N")
    ax.set_ylabel("fraction with exact max")
    ax.set_title(f"|V|={setting['vocab_size']}, T={setting['length']}")
    if legend:
        ax.legend(fontsize=7)


def main_setting(results: dict[str, Any]) -> str:
    """The setting of Fig. 1 (``V20_T4``), or the largest available one."""
    settings = results["settings"]
    if "V20_T4" in settings:
        return "V20_T4"
    return max(settings, key=lambda k: (settings[k]["n_sequences"], k))


def _grid(results: dict[str, Any], panel: Any, title: str, path: Path) -> Path:
    settings = results["settings"]
    vs = sorted({s["vocab_size"] for s in settings.values()})
    ts = sorted({s["length"] for s in settings.values()})
    fig, axes = plt.subplots(
        len(vs), len(ts), figsize=(4.2 * len(ts), 3.4 * len(vs)), squeeze=False
    )
    for i, v in enumerate(vs):
        for j, t in enumerate(ts):
            key = f"V{v}_T{t}"
            if key in settings:
                panel(axes[i, j], settings[key], legend=(i == 0 and j == 0))
            else:
                axes[i, j].set_visible(False)
    fig.suptitle(title)
    # Fixed margins instead of tight_layout (which dominates the plotting time).
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.1, top=0.88, wspace=0.3, hspace=0.45)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _single(setting: dict[str, Any], panel: Any, title: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5.5, 4.0))
    panel(ax, setting)
    ax.set_title(title, fontsize=10)
    fig.subplots_adjust(left=0.14, right=0.97, bottom=0.12, top=0.86)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fig1a(setting: dict[str, Any], cap: str, path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.0))
    plot_entropy_panel(axes[0], setting)
    axes[0].set_title(f"(a) estimating H(p): mean ± std (symlog)\n{cap}", fontsize=10)
    plot_entropy_panel(axes[1], setting, legend=False, quantiles=True)
    axes[1].set_title(f"(a') same, median and 5–95% quantiles\n{cap}", fontsize=10)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.12, top=0.86, wspace=0.25)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def next_token_examples(
    *, seed: int = 0, examples: int = 3, vocab_sizes: tuple[int, ...] = (20, 100)
) -> dict[int, np.ndarray]:
    """Example next-token distributions of the App. C Dirichlet model (the data of Fig. 3).

    Per vocabulary size, ``examples`` independent draws of Dirichlet(:func:`paper_alphas`) with the
    alphas shuffled per draw, as in every tree the study samples; shape ``(examples, V)``. The draws
    depend only on ``seed`` and the vocabulary size.
    """
    from gnll.simulation.distributions import paper_alphas, sample_dirichlet_log_probs

    out = {}
    for v in vocab_sizes:
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(3, v))))
        out[v] = np.exp(sample_dirichlet_log_probs(paper_alphas(v), examples, rng))
    return out


def plot_next_token_examples(
    path: str | Path, *, seed: int = 0, examples: int = 3, vocab_sizes: tuple[int, ...] = (20, 100)
) -> Path:
    """The paper's Fig. 3: :func:`next_token_examples` as bars over the token index, one column per
    vocabulary size and one row per draw."""
    data = next_token_examples(seed=seed, examples=examples, vocab_sizes=vocab_sizes)
    fig, axes = plt.subplots(
        examples, len(vocab_sizes), figsize=(5.2 * len(vocab_sizes), 1.7 * examples + 0.8),
        squeeze=False,
    )  # fmt: skip
    for j, (v, probs) in enumerate(data.items()):
        for i, row in enumerate(probs):
            ax = axes[i, j]
            ax.bar(np.arange(1, v + 1), row, width=0.8, color=_colors(1)[0])
            ax.set_xlim(0.3, v + 0.7)
            ax.set_ylim(0, 1)
            ax.set_ylabel(r"$p(y_t \mid y_{<t})$", fontsize=8)
            if i == 0:
                ax.set_title(f"Vocabulary size (width) = {v}", fontsize=10)
            if i == examples - 1:
                ax.set_xlabel("token")
    fig.suptitle("Example next-token distributions of the Dirichlet model (App. C)", fontsize=11)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.1, top=0.88, wspace=0.2, hspace=0.35)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def make_figures(results: dict[str, Any], output_path: str | Path) -> list[Path]:
    """Write all figures for a :func:`~gnll.simulation.study.run_study` result; return the paths."""
    out = Path(output_path)
    out.mkdir(parents=True, exist_ok=True)
    if not results.get("settings"):
        raise ValueError("results contain no settings to plot")
    key = main_setting(results)
    s = results["settings"][key]
    nd = s["distributions"]
    cap = f"|V|={s['vocab_size']}, T={s['length']}, {nd} distributions"
    return [
        _fig1a(s, cap, out / FIGURE_FILES["fig1a"]),
        _single(
            s,
            plot_max_panel,
            f"(b) estimating M(p): median, 5–95%\n{cap}",
            out / FIGURE_FILES["fig1b"],
        ),
        plot_next_token_examples(
            out / FIGURE_FILES["fig3"], seed=int(results.get("config", {}).get("seed", 0))
        ),
        _grid(
            results,
            plot_entropy_panel,
            "PE estimator error (mean ± std, symlog axis)",
            out / FIGURE_FILES["fig4"],
        ),
        _grid(
            results,
            _entropy_quantile_panel,
            "PE estimator error (median, 5–95% quantiles)",
            out / FIGURE_FILES["fig4_quantiles"],
        ),
        _grid(
            results,
            plot_max_panel,
            "M estimator error (median, 5–95% quantiles)",
            out / FIGURE_FILES["fig5"],
        ),
        _grid(
            results,
            plot_found_max_panel,
            "Fraction of draws whose estimate is the exact max",
            out / FIGURE_FILES["found_max"],
        ),
    ]
