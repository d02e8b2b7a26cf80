"""The cost figure: a labelled log axis even within one decade, and point labels that do not
overlap when measures cost the same (G-NLL / LN-G-NLL; PE / LN-PE / SE / D-SE)."""

from __future__ import annotations

import itertools

import pytest

from gnll.evaluation.results.plots import cost_figure

pytest.importorskip("matplotlib")


def _results(tokens: dict[str, float], auroc: dict[str, float]) -> dict:
    measures = {m: {"auroc": auroc[m], "mean_tokens": tokens[m]} for m in tokens}
    metrics = {"f1": {"n": 10, "accuracy": 0.5, "measures": measures}}
    return {"model": "m", "tasks": {"triviaqa_short": {"metrics": metrics}}}


# The review's --limit 10 run: costs within one decade, equal costs, near-equal AUROCs.
LIMIT10 = _results(
    {"g-nll": 3.2, "ln-g-nll": 3.2, "pe": 9.6, "ln-pe": 9.6, "se": 9.6, "d-se": 9.6},
    {"g-nll": 1.0, "ln-g-nll": 1.0, "pe": 0.78, "ln-pe": 0.78, "se": 0.79, "d-se": 0.8},
)


def test_log_axis_has_tick_labels_within_one_decade():
    import matplotlib.pyplot as plt

    fig = cost_figure(LIMIT10)
    fig.canvas.draw()
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert len(labels) >= 2, labels
    plt.close(fig)


def test_point_labels_do_not_overlap():
    import matplotlib.pyplot as plt
    from matplotlib.text import Annotation, Text

    fig = cost_figure(LIMIT10)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [c for c in fig.axes[0].get_children() if isinstance(c, Annotation)]
    assert sorted(t.get_text() for t in texts) == sorted(
        ["G-NLL", "LN-G-NLL", "PE", "LN-PE", "SE", "D-SE"]
    )
    boxes = [Text.get_window_extent(t, renderer) for t in texts]  # the text, not its leader line
    for (a, ta), (b, tb) in itertools.combinations(zip(boxes, texts, strict=True), 2):
        assert not a.overlaps(b), (ta.get_text(), tb.get_text())
    plt.close(fig)
