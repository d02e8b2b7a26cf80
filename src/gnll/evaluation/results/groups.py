"""How the results of one or more runs group into table rows and dataset averages.

Shared by :mod:`~gnll.evaluation.results.report` (the averaged significance tests in ``results.json``) and
:mod:`~gnll.evaluation.results.tables` (``table.md``), so that both average over the same rows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from gnll.evaluation.results.correctness import judge_index

__all__ = [
    "AVERAGE_ROWS",
    "METRIC_LABELS",
    "MIN_PER_CLASS",
    "PAPER_AVERAGE_ROWS",
    "average_groups",
    "check_average_rows",
    "class_counts",
    "defined",
    "duplicates",
    "enough_per_class",
    "first_judge",
    "iter_rows",
    "judge_mismatch",
    "metric_label",
    "overall_keys",
]

METRIC_LABELS = {"f1": "F1", "judge": "LLM", "contains": "Contains"}


def metric_label(metric: str, results: dict[str, Any]) -> str:
    """The label of a correctness metric in a table (a judge is named after its model).

    >>> cfg = {"config": {"judge": "meta-llama/Llama-3.1-70B,meta-llama/Llama-3.1-70B-Instruct"}}
    >>> metric_label("judge", cfg), metric_label("judge2", cfg), metric_label("f1", cfg)
    ('LLM (meta-llama/Llama-3.1-70B)', 'LLM (meta-llama/Llama-3.1-70B-Instruct)', 'F1')
    """
    index = judge_index(metric)
    if index is not None:
        judges = str(results["config"].get("judge") or "").split(",")
        return f"LLM ({judges[index].strip() if index < len(judges) else metric})"
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


#: The row sets an overall **Average** can span, by name.
AVERAGE_ROWS = {
    "f1+judge": "F1 and the first judge",
    "f1+judges": "F1 and every judge",
}

#: The paper's row set per averaged table. Its Table 1 and Table 5 (AUROC) Averages are the means of
#: their 18 rows, F1 and the base-model judge "LLM" (PE .677 ... G-NLL .721; Table 5 .677 ... .709);
#: its Table 3 (ARA@80) Average is the mean of 30 rows, F1, "LLM" and "LLM-Instruct" (.712 ... .729).
#: ``tests/evaluation/test_paper_averages.py`` recomputes all three from the paper's own rows.
PAPER_AVERAGE_ROWS = {"auroc_averaged": "f1+judge", "ara80": "f1+judges"}


def check_average_rows(rows: str | None) -> str | None:
    """``rows`` if it names a row set of :data:`AVERAGE_ROWS` (or is ``None``: the paper's per table).

    >>> check_average_rows("f1+judges")
    'f1+judges'
    """
    if rows is not None and rows not in AVERAGE_ROWS:
        raise ValueError(
            f"unknown average rows {rows!r}; known: {', '.join(AVERAGE_ROWS)} "
            "(or none: the paper's set per table)"
        )
    return rows


def first_judge(
    groups: dict[tuple[int, str, str, str], list[tuple[str, str, dict[str, Any]]]],
) -> str | None:
    """The label (``LLM (model)``) of the first judge the first judged run lists, or ``None``."""
    for key, rows in groups.items():
        if any(judge_index(m) == 0 for _t, m, _r in rows):
            return key[3]
    return None


def judge_mismatch(
    groups: dict[tuple[int, str, str, str], list[tuple[str, str, dict[str, Any]]]],
) -> str | None:
    """Why "F1 and the first judge" cannot span these runs, or ``None`` when it can.

    The first judge is a judge *model* (:func:`first_judge`), so a run listing the same judges in
    another order still contributes that model's rows; a judged run without that model has no row
    to contribute, and averaging its other judge in its place would mix two judges' rows.
    """
    first = first_judge(groups)
    if first is None:
        return None
    judged: dict[int, set[str]] = {}
    for (run, _model, _mode, label), rows in groups.items():
        if any(judge_index(m) is not None for _t, m, _r in rows):
            judged.setdefault(run, set()).add(label)
    lacking = [run for run, labels in judged.items() if first not in labels]
    if not lacking:
        return None
    return (
        f"run {lacking[0] + 1} has no {first} rows, the first judge of the first judged run; "
        "give every run that judge (or `--average_rows f1+judges`)"
    )


def overall_keys(
    groups: dict[tuple[int, str, str, str], list[tuple[str, str, dict[str, Any]]]],
    rows: str = "f1+judge",
) -> list[tuple[int, str, str, str]]:
    """The groups an overall average spans: the rows of the paper metrics named by ``rows``.

    ``rows`` is a key of :data:`AVERAGE_ROWS`: ``"f1+judge"`` counts F1 and the first judge (the
    paper's Table 1 and Table 5 Averages: 18 rows, the judge behind their "LLM" rows), ``"f1+judges"``
    F1 and every judge (its Table 3 Average: 30 rows, "LLM" and "LLM-Instruct"). With one judge both
    are the same rows. The first judge is a judge model, the first one the first judged run lists
    (:func:`first_judge`): a run that lists the same judges in another order counts the same
    model's rows (:func:`judge_mismatch` says when a run lacks it). Contains is not a paper metric:
    where a paper metric scores the same run and generation length its rows stay out, so a task
    scored under F1 and Contains is not counted twice. A run and length scored by Contains alone
    (no judge for long answers) contributes its first metric.
    """
    check_average_rows(rows)
    first = first_judge(groups)
    by_length: dict[tuple[int, str, str], list[tuple[int, str, str, str]]] = {}
    for key in groups:
        by_length.setdefault((key[0], key[1], key[2]), []).append(key)
    out = []
    for keys in by_length.values():
        paper = [k for k in keys if any(_is_paper(m) for _t, m, _r in groups[k])]
        if rows == "f1+judge":
            paper = [
                k
                for k in paper
                if any(m == "f1" or (judge_index(m) is not None and k[3] == first)
                       for _t, m, _r in groups[k])
            ]  # fmt: skip
        out += paper or [k for k in keys[:1] if not any(_is_paper(m) for _t, m, _r in groups[k])]
    return out


def _is_paper(metric: str, judges: int | None = None) -> bool:
    """F1 or a judge (only the first ``judges`` judges when given)."""
    index = judge_index(metric)
    return metric == "f1" or (index is not None and (judges is None or index < judges))


def defined(mres: dict[str, Any]) -> bool:
    """Whether every measure of a metric row has an AUROC (a row of one class has none)."""
    return all(v.get("auroc") is not None for v in mres["measures"].values())


#: Fewest correct and fewest incorrect answers a row needs before a table prints its AUROC's
#: standard error or a significance star. With fewer, most bootstrap resamples hold one or two
#: answers of the small class (or none, and are skipped), so the standard error collapses towards 0
#: and the paired test can call a difference "significant" that a second draw of questions would
#: not repeat: one correct answer in ten gives AUROC 1.000 ± .000 and p = 1/1001. Ten per class is
#: the usual floor for a rank statistic's normal approximation (and the "ten events" rule of
#: thumb); the AUROC itself is still printed.
MIN_PER_CLASS = 10


def class_counts(mres: dict[str, Any]) -> tuple[int, int]:
    """(correct, incorrect) answers of a metric row (derived from n and accuracy for older runs)."""
    if mres.get("n_correct") is not None and mres.get("n_incorrect") is not None:
        return int(mres["n_correct"]), int(mres["n_incorrect"])
    n = int(mres.get("n") or 0)
    acc = mres.get("accuracy")
    if acc is None or acc != acc:  # NaN: no answers
        return 0, n
    correct = round(float(acc) * n)
    return correct, n - correct


def enough_per_class(mres: dict[str, Any], minimum: int = MIN_PER_CLASS) -> bool:
    """Whether a metric row has at least ``minimum`` correct and ``minimum`` incorrect answers."""
    return min(class_counts(mres)) >= minimum


def duplicates(results_list: Sequence[dict[str, Any]]) -> dict[tuple[str, str], list[int]]:
    """(model, task) -> indices of the runs holding it, for every pair held by more than one run.

    Averaging over datasets would count such a task twice, as if it were two datasets.
    """
    where: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, res in enumerate(results_list):
        for task in res["tasks"]:
            where[(res.get("labelled_from") or res["model"], task)].append(i)
    return {k: v for k, v in where.items() if len(v) > 1}
