"""Fig. 2 ablation on the scripted fake model: every estimator, every number of candidates."""

from __future__ import annotations

import json
import math

from test_eval_runner import FakeModel, make_data_dir

from gnll.evaluation.data.tasks import get_task
from gnll.evaluation.figures.ablation import plot_ablation, run_ablation


def test_ablation_curves_and_figure(tmp_path):
    td = get_task("triviaqa_short").load(data_dir=make_data_dir(tmp_path / "data"))
    model = FakeModel()
    res = run_ablation(model, td, limit=30, widths=(1, 2, 3), temperatures=(0.5, 1.0), samples=4)
    curves = res["auroc"]
    assert set(curves) == {"greedy", "beam search", "sampling T=0.5", "sampling T=1"}
    assert list(curves["beam search"]) == ["1", "2", "3"]
    assert list(curves["sampling T=1"]) == ["1", "2", "3", "4"]
    assert all(0 <= v <= 1 for c in curves.values() for v in c.values() if not math.isnan(v))
    # the fake model is confident exactly when right, so its greedy NLL separates perfectly-ish
    assert curves["greedy"]["1"] > 0.8
    # every AUROC carries its bootstrap standard error, as in the main evaluation's tables
    ses = res["auroc_se"]
    assert {n: list(c) for n, c in ses.items()} == {n: list(c) for n, c in curves.items()}
    assert all(0 <= v < 0.5 for c in ses.values() for v in c.values() if not math.isnan(v))
    assert not math.isnan(ses["greedy"]["1"])  # 0 when every resample separates perfectly
    assert model.calls["greedy"] == 30 and model.calls["beam"] == 30 * 3
    assert model.calls["sample"] == 2 * 30
    png = plot_ablation(res, tmp_path / "fig2.png")
    assert png.stat().st_size > 5_000
    json.dumps(res)  # serialisable, as the script writes it
