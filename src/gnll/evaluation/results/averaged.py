"""The dataset-averaged sections of gnll's tables: AUROC (the paper's Tables 1 and 5) and ARA@80
(its Table 3), each with an overall **Average** over a named row set."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from gnll import measures as M
from gnll.evaluation.results.cells import SMALL_ROWS, columns_of, fmt, header, row_cells
from gnll.evaluation.results.groups import (
    AVERAGE_ROWS,
    PAPER_AVERAGE_ROWS,
    average_groups,
    defined,
    duplicates,
    enough_per_class,
    judge_mismatch,
    overall_keys,
)

__all__ = ["ara80_averaged", "auroc_averaged"]


def _rows_title(section: str, rows: str) -> str:
    """The row set of a table's overall Average, for its heading: named, and whether it is the paper's."""
    paper = PAPER_AVERAGE_ROWS[section]
    which = "the paper's rows for this table" if rows == paper else f"the paper's: {paper}"
    return f"Average over {rows}, {AVERAGE_ROWS[rows]}; {which}"


def auroc_averaged(
    results_list: Sequence[dict[str, Any]],
    significance: dict[str, Any],
    rows: str = PAPER_AVERAGE_ROWS["auroc_averaged"],
) -> list[str]:
    """AUROC averaged over datasets, as in the paper's Table 1 (rows: model / length / metric).

    One group per run x generation length x metric (two runs of one model stay separate rows),
    then the overall **Average** over the row set ``rows`` (:data:`~gnll.evaluation.results.groups.
    AVERAGE_ROWS`) when more than one group counts towards it.
    """
    groups = average_groups(results_list)
    out = ["", f"## AUROC averaged over datasets (↑; {_rows_title('auroc_averaged', rows)})", ""]
    out.append(
        "Mean over the tasks in the row (± combined standard error, sqrt(sum SE²)/k); tasks "
        "whose AUROC is undefined (a single correctness class) are left out. `*`: G-NLL "
        "significantly better than the best sampling-based measure of the row (one-sided paired "
        "bootstrap of the averaged AUROC, questions resampled within each task, p < 0.05). The "
        "overall **Average** is the mean of the printed rows of F1 and the first judge (each row "
        "once, whatever its number of tasks; `#tasks` counts the tasks under them), as the "
        'paper\'s Table 1 and Table 5 average their 18 rows (F1 and the judge of their "LLM" '
        "rows; `gnll table --average_rows f1+judges` counts every judge); the first judge is the "
        "judge model the first judged run lists first, whatever order later runs list it in. "
        "Contains rows stay out where a paper metric scores the same run and length (a task is "
        "not counted twice for F1 and Contains). " + SMALL_ROWS
    )
    out.append("")
    columns = columns_of(results_list)
    out += header(["Model", "Gen.", "Metric", "#tasks"], columns)
    all_vals: dict[str, list[float]] = defaultdict(list)
    all_ses: dict[str, list[float]] = defaultdict(list)
    in_overall = overall_keys(groups, rows)
    overall_enough = True
    n_rows, n_tasks = 0, 0
    for (run, model, mode, label), full_rows in groups.items():
        counted = (run, model, mode, label) in in_overall
        full = [mres for _t, _m, mres in full_rows]
        # Tasks whose AUROCs are undefined (all answers right or all wrong) are left out of the mean.
        lst = [x for x in full if defined(x)]
        enough = all(enough_per_class(x) for x in lst)
        if counted:
            overall_enough = overall_enough and enough
            n_rows += bool(lst)
            n_tasks += len(lst)
        vals, ses = {}, {}
        for m in columns:
            a = [x["measures"][m]["auroc"] for x in lst if m in x["measures"]]
            s = [x["measures"][m]["auroc_se"] for x in lst if m in x["measures"]]
            if a and len(a) == len(lst):
                vals[m] = sum(a) / len(a)
                if counted:  # the Average weighs each printed row once, as the paper's
                    all_vals[m].append(vals[m])
                if all(v is not None for v in s):
                    ses[m] = math.sqrt(sum(v * v for v in s)) / len(s)
                    if counted:
                        all_ses[m].append(ses[m])
        n_txt = str(len(lst)) if len(lst) == len(full) else f"{len(lst)} of {len(full)}"
        star = bool(significance["groups"].get(f"{run}|{mode}|{label}", {}).get("significant"))
        cells = row_cells(vals, ses if enough else None, star and enough, columns)
        out.append("| " + " | ".join([model, mode, label, n_txt] + cells) + " |")
    mismatch = judge_mismatch(groups) if rows == "f1+judge" else None
    if len(in_overall) > 1:
        if duplicates(results_list):
            out += ["", "(No overall average: some runs hold the same model and task.)"]
        elif mismatch:
            out += ["", f"(No overall average: {mismatch}.)"]
        else:
            # The overall test counts only when it was run over these same rows.
            tested_rows = significance.get("overall_rows", PAPER_AVERAGE_ROWS["auroc_averaged"])
            tested = overall_keys(groups, tested_rows) == in_overall
            if tested:
                out += _overall_average(
                    in_overall, (n_rows, n_tasks), all_vals, all_ses, significance,
                    overall_enough, columns,
                )  # fmt: skip
            else:
                sig = {k: v for k, v in significance.items() if k != "overall"}
                out += _overall_average(
                    in_overall, (n_rows, n_tasks), all_vals, all_ses, sig, overall_enough, columns
                )[:1]
                out += ["", f"(Overall average not tested: its test spans {tested_rows}.)"]
    return out


def _overall_average(
    in_overall: Sequence[tuple[int, str, str, str]],
    counts: tuple[int, int],
    all_vals: dict[str, list[float]],
    all_ses: dict[str, list[float]],
    significance: dict[str, Any],
    enough: bool = True,
    columns: Sequence[str] = M.ORDER,
) -> list[str]:
    """The overall **Average** row: the mean of the ``counts[0]`` printed rows it spans (their
    ``counts[1]`` tasks in the ``#tasks`` cell); SE sqrt(sum of the rows' SE²) / rows."""
    n_rows, n_tasks = counts
    vals = {m: sum(v) / len(v) for m, v in all_vals.items() if len(v) == n_rows}
    ses = {
        m: math.sqrt(sum(x * x for x in s)) / len(s) for m, s in all_ses.items() if len(s) == n_rows
    }
    star = enough and bool((significance.get("overall") or {}).get("significant"))
    metrics = " / ".join(dict.fromkeys(k[3] for k in in_overall))
    cells = ["**Average**", "", metrics, str(n_tasks)] + row_cells(
        vals, ses if enough else None, star, columns
    )
    out = ["| " + " | ".join(cells) + " |"]
    if "overall" not in significance:
        out += ["", "(Overall average not tested: `gnll table` needs each run's samples.jsonl.)"]
    return out


def ara80_averaged(
    results_list: Sequence[dict[str, Any]],
    groups: dict[tuple[int, str, str, str], list[tuple[str, str, dict[str, Any]]]],
    rows: str = PAPER_AVERAGE_ROWS["ara80"],
) -> list[str]:
    """The paper's Table 3: ARA@80 averaged over the datasets of each model x length x metric, and
    its overall Average over the row set ``rows`` (:func:`overall_keys`; the paper's: every judge)."""
    title = f"the paper's Table 3; {_rows_title('ara80', rows)}"
    out = ["", f"## Rejection accuracy at 80% averaged over datasets (↑, {title})", ""]
    out.append(
        "Mean ARA@80 over the tasks in the row, as the paper prints it (plus the mean accuracy). "
        "**Average**: the mean of the printed rows of F1 and every judge (each row once, whatever "
        "its number of tasks; `#tasks` counts the tasks under them), as the paper's Table 3 "
        "averages its 30 rows (F1, LLM and LLM-Instruct), unlike its AUROC tables."
    )
    out.append("")
    columns = columns_of(results_list)
    out += header(["Model", "Gen.", "Metric", "#tasks", "Acc."], columns)
    in_overall = overall_keys(groups, rows)
    every: dict[str, list[float]] = defaultdict(list)
    every_acc: list[float] = []
    n_rows, n_cells = 0, 0
    for key, group in groups.items():
        _run, model, mode, label = key
        lst = [mres for _t, _m, mres in group if mres.get("n")]
        vals = {}
        for m in columns:
            a = [x["measures"][m]["ara80"] for x in lst if m in x["measures"]]
            if a and len(a) == len(lst) and all(v is not None for v in a):
                vals[m] = sum(a) / len(a)
                if key in in_overall:  # each printed row once, as the paper's Average
                    every[m].append(vals[m])
        acc = [x["accuracy"] for x in lst if x.get("accuracy") is not None]
        if key in in_overall and lst:
            every_acc += [sum(acc) / len(acc)] if acc else []
            n_rows += 1
            n_cells += len(lst)
        cells = [model, mode, label, str(len(lst)), fmt(sum(acc) / len(acc) if acc else None)]
        out.append("| " + " | ".join(cells + row_cells(vals, None, False, columns)) + " |")
    mismatch = judge_mismatch(groups) if rows == "f1+judge" else None
    if len(in_overall) > 1 and duplicates(results_list):
        out += ["", "(No overall average: some runs hold the same model and task.)"]
    elif len(in_overall) > 1 and mismatch:
        out += ["", f"(No overall average: {mismatch}.)"]
    elif len(in_overall) > 1:
        vals = {m: sum(v) / len(v) for m, v in every.items() if len(v) == n_rows}
        acc_txt = fmt(sum(every_acc) / len(every_acc) if every_acc else None)
        labels = " / ".join(dict.fromkeys(k[3] for k in in_overall))
        cells = ["**Average**", "", labels, str(n_cells), acc_txt]
        out.append("| " + " | ".join(cells + row_cells(vals, None, False, columns)) + " |")
    return out
