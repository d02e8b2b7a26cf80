"""Fig. 2 ablation on the scripted fake model: every estimator, every number of candidates."""

from __future__ import annotations

import json
import math

from fakes import FakeModel, make_data_dir

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


def test_ablation_draws_the_baselines_of_an_eval_run_and_averages_runs(tmp_path):
    """Fig. 2's reference lines: PE ... D-SE from a `gnll eval` run of the same questions, scored
    against the same greedy correctness; and the mean over several runs (the paper's models)."""
    from fakes import cfg

    from gnll.evaluation.figures.ablation import BASELINES, average_ablations, baseline_scores
    from gnll.evaluation.results.metrics import auroc
    from gnll.evaluation.run.runner import Evaluator

    data = make_data_dir(tmp_path / "data")
    run = tmp_path / "run"
    Evaluator(
        cfg(data, run, tasks=["triviaqa_short"], limit=30, beams=0, temperature=1.0),
        model=FakeModel(),
    ).run()
    scores = baseline_scores(run / "samples.jsonl", "triviaqa_short")
    td = get_task("triviaqa_short").load(data_dir=data)
    res = run_ablation(
        FakeModel(), td, limit=30, widths=(1,), temperatures=(1.0,), samples=2, baselines=scores
    )
    assert set(res["baselines"]) == set(BASELINES)
    # the same correctness as the run's F1 rows, so the same AUROCs as its table
    results = json.loads((run / "results.json").read_text())
    f1 = results["tasks"]["triviaqa_short"]["metrics"]["f1"]["measures"]
    for m in BASELINES:
        assert res["baselines"][m] == f1[m]["auroc"]
    recs = [json.loads(x) for x in (run / "samples.jsonl").open()]
    want = auroc([float(r["correctness"]["f1"]["correct"]) for r in recs],
                 [r["measures"]["pe"] for r in recs])  # fmt: skip
    assert res["baselines"]["pe"] == want
    # a run that lacks questions is refused, naming what to rerun
    import pytest

    with pytest.raises(ValueError, match="lacks 10 of the 40"):
        run_ablation(FakeModel(), td, limit=40, widths=(), temperatures=(), baselines=scores)
    # averaging two runs: the mean of every AUROC, SEs combined
    other = {**res, "auroc": {n: {k: v / 2 for k, v in c.items()} for n, c in res["auroc"].items()}}
    mean = average_ablations([res, other])
    g = res["auroc"]["greedy"]["1"]
    assert mean["auroc"]["greedy"]["1"] == (g + g / 2) / 2
    assert mean["baselines"]["se"] == res["baselines"]["se"] and mean["n"] == 60
    se = res["auroc_se"]["beam search"]["1"]
    assert math.isclose(mean["auroc_se"]["beam search"]["1"], math.sqrt(2 * se * se) / 2)
    png = plot_ablation(mean, tmp_path / "mean.png")
    assert png.stat().st_size > 5_000


def test_baselines_added_afterwards_equal_those_given_up_front(tmp_path):
    """An ablation made side by side with its baseline run gets the same lines afterwards
    (``scripts/fig2_ablation.py --result``): it records each question's id and correctness."""
    from gnll.evaluation.figures.ablation import BASELINES, add_baselines

    td = get_task("triviaqa_short").load(data_dir=make_data_dir(tmp_path / "data"))
    kw = dict(limit=20, widths=(1,), temperatures=(1.0,), samples=2)
    plain = run_ablation(FakeModel(), td, **kw)
    assert len(plain["ids"]) == len(plain["correct"]) == 20 and "baselines" not in plain
    scores = {i: {m: (k * 7 % 11) / 11 + j for j, m in enumerate(BASELINES)}
              for k, i in enumerate(plain["ids"])}  # fmt: skip
    upfront = run_ablation(FakeModel(), td, baselines=scores, **kw)
    later = add_baselines(json.loads(json.dumps(plain)), scores)
    assert later["baselines"] == upfront["baselines"]
    assert later["baselines_se"] == upfront["baselines_se"]


def test_committed_fig2_is_both_embedded_models_with_baselines_averaged():
    """docs/img/fig2_mean.json (the figure in docs/evaluation.md) is the mean of the two embedded
    models' committed results, each with the paper's baseline lines."""
    from pathlib import Path

    from gnll.evaluation.figures.ablation import BASELINES, average_ablations

    img = Path(__file__).resolve().parents[2] / "docs" / "img"
    runs = [json.loads((img / f"fig2_{m}.json").read_text()) for m in ("smollm2", "gemma")]
    assert [r["model"] for r in runs] == ["smollm2-135m-instruct", "gemma-3-270m"]
    for r in runs:
        assert set(r["baselines"]) == set(BASELINES)
        assert set(r["auroc"]) >= {"greedy", "beam search", "sampling T=1"}
    mean = json.loads((img / "fig2_mean.json").read_text())
    assert mean["auroc"] == average_ablations(runs)["auroc"]
    assert mean["baselines"] == average_ablations(runs)["baselines"]
    assert [r["model"] for r in mean["runs"]] == [r["model"] for r in runs]
    assert (img / "fig2_mean.png").stat().st_size > 5_000
