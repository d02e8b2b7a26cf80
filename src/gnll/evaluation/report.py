"""Results (``results.json``) and the paper-style tables (``table.md``).

``results.json`` holds, per task and correctness metric, the number of questions, the accuracy of
the
greedy answers, and per measure its AUROC with bootstrap standard error, ARA@80, AURAC and the mean
number of generated tokens it needs per question; the paired bootstrap test of G-NLL against the
best
sampling-based measure; the sampling temperature and how it was chosen; agreement between
correctness
metrics; and the full configuration with seeds and library versions. It is deterministic: run it
twice
(or resume an interrupted run) and the file is byte-identical.

:func:`render_table` lays one or more results out like the paper's Table 1.
"""

from __future__ import annotations

import json
import math
import platform
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gnll import measures as M
from gnll.evaluation.correctness import agreement
from gnll.evaluation.metrics import evaluate_measures

__all__ = ["SCHEMA", "build_results", "load_results", "render_table", "versions"]

SCHEMA = "gnll.eval.results/1"
METRIC_LABELS = {"f1": "F1", "judge": "LLM", "contains": "Contains"}


def versions() -> dict[str, str]:
    """Versions of Python and the libraries that shape results."""
    out = {"python": platform.python_version()}
    import importlib

    for mod in ("gnll", "numpy", "scipy", "sklearn", "torch", "transformers"):
        try:
            out[mod] = str(importlib.import_module(mod).__version__)
        except Exception:  # noqa: BLE001 - a missing optional library is simply not recorded
            continue
    return out


def _nan_to_none(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_nan_to_none(v) for v in obj]
    return obj


def build_results(
    samples_path: str | Path, config: Any, task_meta: dict[str, Any], components: dict[str, Any]
) -> dict[str, Any]:
    """Compute ``results.json`` from ``samples.jsonl`` (read once, keeping scores per question)."""
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    with open(samples_path, encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            rows[r["task"]].append(
                {
                    "correct": {m: v.get("correct") for m, v in r["correctness"].items()},
                    "measures": r["measures"],
                    "cost": r.get("cost_tokens", {}),
                }
            )
    tasks_out: dict[str, Any] = {}
    for task, meta in task_meta.items():
        trs = rows.get(task, [])
        metrics_out: dict[str, Any] = {}
        names = [m for m in M.ORDER if trs and all(m in row["measures"] for row in trs)]
        mean_tokens = {}
        for m in names:
            src = M.get(m).source
            mean_tokens[m] = sum(row["cost"].get(src, 0) for row in trs) / len(trs)
        for metric in meta["correctness"]:
            keep = [row for row in trs if row["correct"].get(metric) is not None]
            correct = [float(row["correct"][metric]) for row in keep]
            scores = {m: [row["measures"][m] for row in keep] for m in names}
            res = evaluate_measures(correct, scores, n_boot=config.n_boot, seed=config.seed)
            res["n_undecided"] = len(trs) - len(keep)
            for m in names:
                res["measures"][m]["mean_tokens"] = mean_tokens[m]
            metrics_out[metric] = res
        agreements = {}
        present = [m for m in ("f1", "contains", "judge") if m in meta["correctness"]]
        for i, a in enumerate(present):
            for b in present[i + 1 :]:
                agreements[f"{a}_vs_{b}"] = agreement(
                    [row["correct"].get(a) for row in trs], [row["correct"].get(b) for row in trs]
                )
        tasks_out[task] = {**meta, "metrics": metrics_out, "agreement": agreements}
    results = {
        "schema": SCHEMA,
        "model": config.model,
        "config": config.public(),
        "components": components,
        "versions": versions(),
        "tasks": tasks_out,
    }
    return _nan_to_none(results)


def load_results(path: str | Path) -> dict[str, Any]:
    """Read ``results.json`` from a run directory (or the file itself)."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.exists():
        raise FileNotFoundError(
            f"{p} not found: is {path} the --output_path of a finished `gnll eval` run?"
        )
    data = json.loads(p.read_text(encoding="utf-8"))
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{p}: not a gnll eval results file (schema {data.get('schema')!r})")
    return data


# ------------------------------------------------------------------------------------------ tables
def _undefined(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _fmt(x: float | None) -> str:
    if _undefined(x):
        return "–"
    s = f"{x:.3f}"
    return s[1:] if s.startswith("0.") else ("-" + s[2:] if s.startswith("-0.") else s)


def _metric_label(metric: str, results: dict[str, Any]) -> str:
    if metric == "judge":
        return f"LLM ({results['config'].get('judge')})"
    return METRIC_LABELS.get(metric, metric)


def _row_cells(
    values: dict[str, float | None], ses: dict[str, float | None] | None, star: bool
) -> list[str]:
    present = {m: v for m, v in values.items() if v is not None}
    best = max((round(v, 3) for v in present.values()), default=None)
    cells = []
    for m in M.ORDER:
        v = values.get(m)
        if v is None:
            cells.append("–")
            continue
        txt = _fmt(v)
        if ses is not None and ses.get(m) is not None:
            txt += f" ± {_fmt(ses[m])}"
        if best is not None and round(v, 3) == best:
            txt = f"**{txt}**"
        if star and m == "g-nll":
            txt += "\\*"
        cells.append(txt)
    return cells


def _header(first: Sequence[str]) -> list[str]:
    head = list(first) + [M.get(m).label for m in M.ORDER]
    return ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]


def _iter_rows(results_list: Sequence[dict[str, Any]]):
    for res in results_list:
        for task, tres in res["tasks"].items():
            for metric, mres in tres["metrics"].items():
                yield res, task, tres, metric, mres


def render_table(results_list: Sequence[dict[str, Any]]) -> str:
    """Markdown tables: AUROC, averages over datasets, ARA@80, AURAC, temperatures, agreement."""
    out: list[str] = []
    out.append("## AUROC (↑)")
    out.append("")
    out.append(
        "Positives are incorrect greedy answers, the score is the uncertainty; ± bootstrap "
        "standard error; best per row in bold; `*`: G-NLL significantly better than the best "
        "sampling-based measure of the "
        "paper (PE, LN-PE, SE, LN-SE, D-SE; one-sided paired bootstrap, p < 0.05). "
        "PE…MCP use N sampled answers, G-NLL and LN-G-NLL the greedy answer only, BS-MSP K beams."
    )
    out.append("")
    out += _header(["Model", "Task", "Metric", "n", "Acc."])
    for res, task, _tres, metric, mres in _iter_rows(results_list):
        ms = mres["measures"]
        values = {m: ms[m]["auroc"] for m in ms}
        ses = {m: ms[m]["auroc_se"] for m in ms}
        star = bool(mres.get("significance", {}).get("significant"))
        cells = [
            res["model"],
            task,
            _metric_label(metric, res),
            str(mres["n"]),
            _fmt(mres["accuracy"]),
        ]
        out.append("| " + " | ".join(cells + _row_cells(values, ses, star)) + " |")

    # Averages over datasets, as in the paper's Table 1 (rows: model / generation length / metric).
    # One group per run x generation length x metric (two runs of one model stay separate rows).
    groups: dict[tuple[int, str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for i, res in enumerate(results_list):
        for _res, task, tres, metric, mres in _iter_rows([res]):
            mode = tres.get("mode", task.rsplit("_", 1)[-1])
            groups[(i, res["model"], mode, _metric_label(metric, res))].append(mres)
    out += ["", "## AUROC averaged over datasets (↑)", ""]
    out.append(
        "Mean over the tasks in the row (± combined standard error, sqrt(sum SE²)/k); tasks "
        "whose AUROC is undefined (a single correctness class) are left out."
    )
    out.append("")
    out += _header(["Model", "Gen.", "Metric", "#tasks"])
    all_vals: dict[str, list[float]] = defaultdict(list)
    all_ses: dict[str, list[float]] = defaultdict(list)
    for (_run, model, mode, label), full in groups.items():
        # Tasks whose AUROCs are undefined (all answers right or all wrong) are left out of the mean.
        lst = [x for x in full if all(v.get("auroc") is not None for v in x["measures"].values())]
        vals, ses = {}, {}
        for m in M.ORDER:
            a = [x["measures"][m]["auroc"] for x in lst if m in x["measures"]]
            s = [x["measures"][m]["auroc_se"] for x in lst if m in x["measures"]]
            if a and len(a) == len(lst):
                vals[m] = sum(a) / len(a)
                all_vals[m] += a
                if all(v is not None for v in s):
                    ses[m] = math.sqrt(sum(v * v for v in s)) / len(s)
                    all_ses[m] += s
        n_txt = str(len(lst)) if len(lst) == len(full) else f"{len(lst)} of {len(full)}"
        out.append(
            "| " + " | ".join([model, mode, label, n_txt] + _row_cells(vals, ses, False)) + " |"
        )
    if len(groups) > 1:
        n_rows = max((len(v) for v in all_vals.values()), default=0)
        vals = {m: sum(v) / len(v) for m, v in all_vals.items() if len(v) == n_rows}
        ses = {
            m: math.sqrt(sum(x * x for x in s)) / len(s)
            for m, s in all_ses.items()
            if len(s) == n_rows
        }
        out.append(
            "| "
            + " | ".join(["**Average**", "", "", str(n_rows)] + _row_cells(vals, ses, False))
            + " |"
        )

    for key, title in (("ara80", "Rejection accuracy at 80% (↑)"), ("aurac", "AURAC (↑)")):
        out += ["", f"## {title}", ""]
        if key == "ara80":
            out.append(
                "Accuracy on the 80% of questions with the lowest uncertainty "
                "(ties at expected value)."
            )
        else:
            out.append("Area under the accuracy-vs-retained-fraction curve.")
        out.append("")
        out += _header(["Model", "Task", "Metric", "n", "Acc."])
        for res, task, _tres, metric, mres in _iter_rows(results_list):
            ms = mres["measures"]
            values = {m: ms[m][key] for m in ms}
            cells = [
                res["model"],
                task,
                _metric_label(metric, res),
                str(mres["n"]),
                _fmt(mres["accuracy"]),
            ]
            out.append("| " + " | ".join(cells + _row_cells(values, None, False)) + " |")

    temps = []
    for res in results_list:
        for task, tres in res["tasks"].items():
            sel = tres.get("temperature") or {}
            if sel.get("value") is None:
                continue
            cand = sel.get("candidates") or {}
            detail = ", ".join(f"T={t}: {_fmt(c.get('mean_auroc'))}" for t, c in cand.items())
            how = sel["selected_by"]
            if cand and all(_undefined(c.get("mean_auroc")) for c in cand.values()):
                how = "default (held-out AUROC undefined)"
            temps.append(
                f"| {res['model']} | {task} | {sel['value']:g} | {how} | {detail or '–'} |"
            )
    if temps:
        out += ["", "## Sampling temperature", ""]
        out.append(
            "Chosen per task from the candidates by the mean held-out AUROC of the "
            "sampling-based measures."
        )
        out.append("")
        out += [
            "| Model | Task | T | Chosen by | Held-out mean AUROC |",
            "|---|---|---|---|---|",
        ] + temps

    agree = []
    for res in results_list:
        for task, tres in res["tasks"].items():
            for pair, a in (tres.get("agreement") or {}).items():
                agree.append(
                    f"| {res['model']} | {task} | {pair.replace('_vs_', ' vs ')} | {a['n']} | "
                    f"{_fmt(a['agreement'])} | {_fmt(a['kappa'])} |"
                )
    if agree:
        out += ["", "## Agreement between correctness metrics", ""]
        out.append(
            "How far to trust a small judge: agreement rate and Cohen's kappa on the "
            "questions both metrics decided."
        )
        out.append("")
        out += [
            "| Model | Task | Metrics | n | Agreement | Cohen's κ |",
            "|---|---|---|---|---|---|",
        ] + agree
    return "\n".join(out) + "\n"
