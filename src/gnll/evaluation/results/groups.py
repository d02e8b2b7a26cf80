"""How the results of one or more runs group into table rows and dataset averages.

Shared by :mod:`~gnll.evaluation.results.report` (the averaged significance tests in ``results.json``) and
:mod:`~gnll.evaluation.results.tables` (``table.md``), so that both average over the same rows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = [
    "METRIC_LABELS",
    "average_groups",
    "defined",
    "iter_rows",
    "metric_label",
    "overall_keys",
]

METRIC_LABELS = {"f1": "F1", "judge": "LLM", "contains": "Contains"}


def metric_label(metric: str, results: dict[str, Any]) -> str:
    """The label of a correctness metric in a table (the judge is named after its model)."""
    if metric == "judge":
        return f"LLM ({results['config'].get('judge')})"
    return METRIC_LABELS.get(metric, metric)


def iter_rows(
    results_list: Sequence[dict[str, Any]],
) -> Iterator[tuple[dict[str, Any], str, dict[str, Any], str, dict[str, Any]]]:
    """Every (results, task, task results, metric, metric results) row of the runs, in order."""
    for res in results_list:
        for task, tres in res["tasks"].items():
            for metric, mres in tres["metrics"].items():
                yield res, task, tres, metric, mres


def average_groups(
    results_list: Sequence[dict[str, Any]],
) -> dict[tuple[int, str, str, str], list[tuple[str, str, dict[str, Any]]]]:
    """Rows of the dataset-averaged table: run x generation length x metric -> (task, metric, row)."""
    groups: dict[tuple[int, str, str, str], list[tuple[str, str, dict[str, Any]]]] = defaultdict(
        list
    )
    for i, res in enumerate(results_list):
        for _res, task, tres, metric, mres in iter_rows([res]):
            mode = tres.get("mode", task.rsplit("_", 1)[-1])
            groups[(i, res["model"], mode, metric_label(metric, res))].append((task, metric, mres))
    return groups


def overall_keys(groups: dict[tuple[int, str, str, str], Any]) -> list[tuple[int, str, str, str]]:
    """The groups the overall average spans: per run and generation length, its first metric.

    A task scored under several correctness metrics (``--correctness f1,contains``) is one dataset,
    not several: averaging all its metric rows would count its questions twice and understate the
    standard error. The paper's overall average takes one metric per generation length (F1 for
    short answers, the judge for long ones); the first metric of a run plays that part here.
    """
    first: dict[tuple[int, str, str], tuple[int, str, str, str]] = {}
    for key in groups:
        first.setdefault((key[0], key[1], key[2]), key)
    return list(first.values())


def defined(mres: dict[str, Any]) -> bool:
    """Whether every measure of a metric row has an AUROC (a row of one class has none)."""
    return all(v.get("auroc") is not None for v in mres["measures"].values())
