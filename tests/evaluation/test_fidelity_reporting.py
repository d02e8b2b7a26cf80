"""Paper-fidelity points of the reporting: the F1 rule, averaged-row significance, table notes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fakes import FakeJudge, FakeModel, cfg

from gnll.evaluation.results.correctness import f1_rule_disagreements, f1_verdict
from gnll.evaluation.results.metrics import averaged_paired_test, paired_bootstrap_test
from gnll.evaluation.run.runner import EvalConfig, Evaluator


# ------------------------------------------------------------------------------------ F1 rule
@pytest.mark.parametrize(
    ("pred", "gold", "gt", "ge"),
    [
        ("Kennedy", "John F. Kennedy", False, True),  # F1 = 2 * 1 * 1/3 / (4/3) = 0.5
        ("President Obama", "Barack Obama", False, True),  # 0.5
        ("Obama", "Barack Obama", True, True),  # 2/3
        ("Paris", "London", False, False),
    ],
)
def test_f1_rule_gt_is_the_papers_and_ge_the_reference_codes(pred, gold, gt, ge):
    assert f1_verdict(pred, [gold]).correct is gt
    assert f1_verdict(pred, [gold], rule="ge").correct is ge


def test_f1_rule_does_not_touch_numeric_verdicts_and_rejects_unknown_rules():
    assert f1_verdict("51 dollars", ["51"], 51.0).correct is True
    with pytest.raises(ValueError, match="unknown F1 rule"):
        f1_verdict("a", ["a"], rule=">")
    verdicts = [
        f1_verdict(p, [g]).to_dict()
        for p, g in [("Kennedy", "John F. Kennedy"), ("Obama", "Barack Obama")]
    ]
    verdicts.append(f1_verdict("5", ["5"], 5.0).to_dict())
    assert f1_rule_disagreements(verdicts) == 1


def test_run_records_f1_rule_and_its_disagreements(data_dir, tmp_path):
    res = Evaluator(
        cfg(data_dir, tmp_path / "r", measures=["g-nll"], f1_rule="ge"), model=FakeModel()
    ).run()
    rule = res["tasks"]["triviaqa_short"]["f1_rule"]
    assert rule["rule"] == "ge" and rule["n"] == 24
    # the fake answers "n17" for "n18": F1 0 or 1, never exactly 0.5, so the rules agree
    assert rule["disagreements"] == 0
    table = (tmp_path / "r" / "table.md").read_text()
    assert "F1 >= 0.5" in table and "triviaqa_short 24 of" in table
    with pytest.raises(ValueError, match="f1_rule"):
        EvalConfig(model="m", tasks=["svamp_short"], output_path=tmp_path, f1_rule="geq")


# ------------------------------------------------------------------ averaged-row significance
def _task(rng, n, strength):
    c = rng.random(n) < 0.5
    good = np.where(c, 0.0, strength) + rng.normal(size=n)
    bad = rng.normal(size=n)
    return c.astype(float), good, bad


def test_averaged_test_one_task_equals_the_per_task_test():
    rng = np.random.default_rng(0)
    c, good, bad = _task(rng, 60, 0.6)
    per_task = paired_bootstrap_test(c, good, bad, n_boot=300, seed=0)
    avg = averaged_paired_test([("t", c, {"g-nll": good, "pe": bad})], n_boot=300, seed=0)
    assert avg["diff"] == pytest.approx(per_task["diff"])
    assert avg["best_baseline"] == "pe" and 0 < avg["p_value"] <= 1


def test_averaged_test_pools_evidence_over_tasks():
    """Three tasks, each too small to be significant alone, are significant on average."""
    rng = np.random.default_rng(3)
    tasks = [_task(rng, 40, 0.9) for _ in range(3)]
    singles = [
        averaged_paired_test([(f"t{i}", c, {"g-nll": g, "pe": b})], n_boot=400)
        for i, (c, g, b) in enumerate(tasks)
    ]
    both = averaged_paired_test(
        [(f"t{i}", c, {"g-nll": g, "pe": b}) for i, (c, g, b) in enumerate(tasks)], n_boot=400
    )
    assert both["p_value"] < min(s["p_value"] for s in singles)
    assert both["significant"]
    # and the reverse comparison is far from significant
    flipped = averaged_paired_test(
        [(f"t{i}", c, {"g-nll": b, "pe": g}) for i, (c, g, b) in enumerate(tasks)], n_boot=400
    )
    assert flipped["p_value"] > 0.5 and not flipped["significant"]


def test_averaged_test_picks_the_best_baseline_by_mean_auroc_and_handles_one_class():
    rng = np.random.default_rng(1)
    c, good, bad = _task(rng, 50, 1.0)
    res = averaged_paired_test([("a", c, {"g-nll": bad, "pe": bad, "se": good})], n_boot=100)
    assert res["best_baseline"] == "se" and not res["significant"]
    one = averaged_paired_test([("a", np.ones(5), {"g-nll": np.arange(5), "pe": np.arange(5)})])
    assert "significant" not in one and "single" in one["note"]


def test_table_stars_averaged_rows_and_cli_overall(data_dir, tmp_path):
    from typer.testing import CliRunner

    from gnll.cli.main import app

    for name in ("a", "b"):
        Evaluator(
            cfg(
                data_dir,
                tmp_path / name,
                model=f"model-{name}",
                measures=["g-nll", "pe"],
                temperature=1.0,
                tasks=["triviaqa_short", "nq_open_short"],
                limit=60,
            ),
            model=FakeModel(f"model-{name}"),
        ).run()
    res = json.loads((tmp_path / "a" / "results.json").read_text())
    group = res["averages"]["groups"]["0|short|F1"]
    assert group["n_tasks"] == 2 and group["best_baseline"] == "pe" and group["stratified"]
    # the fake model's G-NLL is informative and its samples are too; the test is well defined
    assert 0 < group["p_value"] <= 1
    out = CliRunner().invoke(app, ["table", str(tmp_path / "a"), str(tmp_path / "b")])
    assert out.exit_code == 0, out.output
    assert "Overall average not tested" not in out.output
    assert "questions resampled within each task" in out.output


def test_table_header_names_the_judge_fallback_and_counts_unparseable_replies(data_dir, tmp_path):
    res = Evaluator(
        cfg(
            data_dir,
            tmp_path / "j",
            judge="fake-judge",
            measures=["g-nll"],
            tasks=["triviaqa_short"],
        ),
        model=FakeModel(),
        judge=FakeJudge("fake-judge"),
    ).run()
    k = res["tasks"]["triviaqa_short"]["judge_unparseable"]
    assert k == res["tasks"]["triviaqa_short"]["metrics"]["judge"]["n_undecided"]
    assert f"triviaqa_short: {k}" in (tmp_path / "j" / "table.md").read_text()
    Evaluator(
        cfg(data_dir, tmp_path / "n", measures=["g-nll"], tasks=["triviaqa_long"]),
        model=FakeModel(),
    ).run()
    assert "**No judge**: triviaqa_long" in (tmp_path / "n" / "table.md").read_text()


def test_table3_averages_ara80_over_datasets(data_dir, tmp_path):
    res = Evaluator(
        cfg(data_dir, tmp_path / "t3", measures=["g-nll", "pe"], temperature=1.0),
        model=FakeModel(),
    ).run()
    table = (tmp_path / "t3" / "table.md").read_text()
    section = table.split("the paper's Table 3;")[1].split("\n## ")[0]
    row = next(line for line in section.splitlines() if line.startswith("| fake-lm | short | F1"))
    aras = [res["tasks"][t]["metrics"]["f1"]["measures"]["g-nll"]["ara80"] for t in res["tasks"]]
    want = f"{sum(aras) / len(aras):.3f}".lstrip("0")
    assert want in row.replace("**", "") and "| 2 |" in row


def test_overall_average_counts_a_task_once_under_its_first_metric(data_dir, tmp_path):
    """With ``--correctness f1,contains`` each task has two metric rows; the overall average (and
    its paired test) spans the tasks under the first metric only, not every row twice."""
    from gnll.evaluation.results.tables import render_table
    from gnll.measures import registry as M

    res = Evaluator(
        cfg(
            data_dir,
            tmp_path / "two",
            measures=["g-nll", "pe"],
            temperature=1.0,
            tasks=["triviaqa_short", "nq_open_short"],
            correctness=["f1", "contains"],
            limit=60,
        ),
        model=FakeModel(),
    ).run()
    assert set(res["averages"]["groups"]) == {"0|short|F1", "0|short|Contains"}
    # two metric groups of one generation length: no overall average, nothing tested twice
    assert "overall" not in res["averages"]
    table = render_table([res])
    assert "| **Average**" not in table
    # two runs: the overall average is the mean of the F1 rows of both, Contains left out
    res_b = json.loads(json.dumps(res))
    res_b["model"] = "fake-b"
    table = render_table([res, res_b])
    row = next(line for line in table.splitlines() if line.startswith("| **Average**"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "F1" and cells[3] == "4"
    f1 = [res["tasks"][t]["metrics"]["f1"]["measures"]["g-nll"]["auroc"] for t in res["tasks"]]
    gnll_cell = cells[4 + M.ORDER.index("g-nll")]
    assert gnll_cell.replace("**", "").split(" ")[0] == f"{sum(f1) / len(f1):.3f}".lstrip("0")
