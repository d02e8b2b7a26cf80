"""Issue 28 (second fidelity pass): per-dataset temperatures, the overall Average over every paper
metric, several judges, the clusterer in the table header, the presets' splits."""

from __future__ import annotations

import pytest
from test_eval_runner import FakeModel, cfg, make_data_dir

from gnll.evaluation.runner import Evaluator


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_data_dir(tmp_path_factory.mktemp("data"))


# ----------------------------------------------------------------- 28.6: temperature per dataset
def test_temperature_scope_dataset_shares_one_choice_between_short_and_long(data_dir, tmp_path):
    tasks = ["triviaqa_short", "triviaqa_long"]
    per_task = Evaluator(
        cfg(data_dir, tmp_path / "task", tasks=tasks, beams=0, correctness=["f1"]),
        model=FakeModel(),
    ).run()["tasks"]
    per_data = Evaluator(
        cfg(
            data_dir,
            tmp_path / "data",
            tasks=tasks,
            beams=0,
            correctness=["f1"],
            temperature_scope="dataset",
        ),
        model=FakeModel(),
    ).run()["tasks"]
    short, long = (per_data[t]["temperature"] for t in tasks)
    assert short["scope"] == "dataset" and short["pooled_tasks"] == tasks
    assert short["per_measure"] == long["per_measure"]
    # the choice is made on the mean of the two tasks' held-out AUROCs, per measure
    a, b = (per_task[t]["temperature"]["candidates"] for t in tasks)
    for key, row in short["candidates"].items():
        for m, v in row["auroc"].items():
            assert v == pytest.approx((a[key]["auroc"][m] + b[key]["auroc"][m]) / 2)
    for m, t in short["per_measure"].items():
        best = max(row["auroc"][m] for row in short["candidates"].values())
        assert short["candidates"][f"{t:g}"]["auroc"][m] == best
    assert per_task["triviaqa_short"]["temperature"]["scope"] == "task"
