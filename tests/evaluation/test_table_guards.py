"""Tables that do not overclaim: no standard error or star from a handful of answers of one
class, and no average that counts one model's dataset twice."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gnll import measures as M
from gnll.cli.main import app
from gnll.evaluation.results.groups import MIN_PER_CLASS, class_counts
from gnll.evaluation.results.report import SCHEMA
from gnll.evaluation.results.tables import render_table


def _metric(n: int, accuracy: float, gnll: float, se: float, significant: bool) -> dict:
    return {
        "n": n,
        "accuracy": accuracy,
        "measures": {
            "g-nll": {"auroc": gnll, "auroc_se": se, "ara80": 0.5, "aurac": 0.5},
            "pe": {"auroc": 0.6, "auroc_se": 0.05, "ara80": 0.5, "aurac": 0.5},
        },
        "significance": {"significant": significant, "p_value": 0.001, "best_baseline": "pe"},
    }


def _run(model: str, tasks: dict[str, dict]) -> dict:
    return {
        "schema": SCHEMA,
        "model": model,
        "config": {},
        "tasks": {
            t: {"mode": "short", "correctness": ["f1"], "metrics": {"f1": m}}
            for t, m in tasks.items()
        },
    }


def _gnll_cell(table: str, model: str, task: str) -> str:
    line = next(x for x in table.splitlines() if x.startswith(f"| {model} | {task} |"))
    return line.strip("|").split("|")[5 + M.ORDER.index("g-nll")].strip()


def test_no_standard_error_or_star_below_the_minimum_per_class():
    # The review's case: 10 questions, one correct: AUROC 1.000 ± .000 and a star.
    tiny = _metric(10, 0.1, 1.0, 0.0, True)
    big = _metric(400, 0.4, 0.8, 0.02, True)
    assert class_counts(tiny) == (1, 9) and class_counts(big) == (160, 240)
    table = render_table([_run("m", {"triviaqa_short": tiny, "svamp_short": big})])
    assert _gnll_cell(table, "m", "triviaqa_short") == "**1.000**"  # value kept, no ± and no *
    assert _gnll_cell(table, "m", "svamp_short") == "**.800 ± .020**\\*"
    assert f"at least {MIN_PER_CLASS} correct and {MIN_PER_CLASS} incorrect" in table
    # The averaged row holds the tiny task: no ± and no star there either.
    part = table.split("## AUROC averaged", 1)[1]
    row = next(x for x in part.splitlines() if x.startswith("| m | short |"))
    assert "±" not in row.split("|")[5 + M.ORDER.index("g-nll")] and "\\*" not in row
    # Exactly the minimum of each class is enough.
    edge = _metric(2 * MIN_PER_CLASS, 0.5, 0.7, 0.05, True)
    assert "±" in _gnll_cell(render_table([_run("m", {"t_short": edge})]), "m", "t_short")


def test_two_runs_of_one_model_and_task_are_refused_or_labelled(tmp_path):
    run = _run("smollm2", {"triviaqa_short": _metric(400, 0.4, 0.8, 0.02, True)})
    with pytest.raises(ValueError, match="smollm2 / triviaqa_short"):
        render_table([run, run])
    for name in ("eval1", "demo"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(run))
    args = ["table", str(tmp_path / "eval1"), str(tmp_path / "demo")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2
    assert "smollm2 / triviaqa_short is in" in res.output and "--allow_duplicates" in res.output
    res = CliRunner().invoke(app, [*args, "--allow_duplicates"])
    assert res.exit_code == 0, res.output
    assert "| smollm2 (eval1) | triviaqa_short |" in res.stdout
    assert "| smollm2 (demo) | triviaqa_short |" in res.stdout
    assert "| **Average**" not in res.stdout and "No overall average" in res.stdout
    # Different models on one task still average.
    other = _run("gemma", {"triviaqa_short": _metric(400, 0.4, 0.7, 0.02, False)})
    assert "| **Average**" in render_table([run, other])
