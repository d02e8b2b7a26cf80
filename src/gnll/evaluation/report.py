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
from gnll._util import jsonable
from gnll.evaluation.correctness import agreement, f1_rule_disagreements
from gnll.evaluation.metrics import averaged_paired_test, evaluate_measures

__all__ = [
    "SCHEMA",
    "averaged_significance",
    "build_results",
    "load_results",
    "read_strata",
    "render_table",
    "versions",
]

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


def _read_rows(samples_path: str | Path) -> dict[str, list[dict[str, Any]]]:
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    with open(samples_path, encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            rows[r["task"]].append(
                {
                    "verdicts": r["correctness"],
                    "correct": {m: v.get("correct") for m, v in r["correctness"].items()},
                    "measures": r["measures"],
                    "cost": r.get("cost_tokens", {}),
                }
            )
    return rows


def _strata(
    rows: dict[str, list[dict[str, Any]]], task_meta: dict[str, Any]
) -> dict[tuple[str, str], tuple[list[float], dict[str, list[float]]]]:
    """Per (task, metric): the decided questions' correctness and every table measure's scores."""
    out = {}
    for task, meta in task_meta.items():
        trs = rows.get(task, [])
        names = [m for m in M.ORDER if trs and all(m in row["measures"] for row in trs)]
        for metric in meta["correctness"]:
            keep = [row for row in trs if row["correct"].get(metric) is not None]
            correct = [float(row["correct"][metric]) for row in keep]
            out[(task, metric)] = (
                correct,
                {m: [row["measures"][m] for row in keep] for m in names},
            )
    return out


def read_strata(run_dir: str | Path) -> dict[tuple[str, str], tuple[list[float], dict]] | None:
    """The per-question data of a finished run (from its ``samples.jsonl``), or ``None`` if absent."""
    run_dir = Path(run_dir)
    samples = run_dir / "samples.jsonl"
    if not samples.exists():
        return None
    res = load_results(run_dir)
    meta = {t: {"correctness": list(v["metrics"])} for t, v in res["tasks"].items()}
    return _strata(_read_rows(samples), meta)


def _average_groups(
    results_list: Sequence[dict[str, Any]],
) -> dict[tuple[int, str, str, str], list[tuple[str, str, dict[str, Any]]]]:
    """Rows of the dataset-averaged table: run x generation length x metric -> (task, metric, row)."""
    groups: dict[tuple[int, str, str, str], list[tuple[str, str, dict[str, Any]]]] = defaultdict(
        list
    )
    for i, res in enumerate(results_list):
        for _res, task, tres, metric, mres in _iter_rows([res]):
            mode = tres.get("mode", task.rsplit("_", 1)[-1])
            groups[(i, res["model"], mode, _metric_label(metric, res))].append((task, metric, mres))
    return groups


def _defined(mres: dict[str, Any]) -> bool:
    return all(v.get("auroc") is not None for v in mres["measures"].values())


def averaged_significance(
    results_list: Sequence[dict[str, Any]],
    strata_list: Sequence[dict[tuple[str, str], tuple[list[float], dict]] | None],
    *,
    n_boot: int | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """Stratified paired tests of G-NLL on every dataset-averaged row and on the overall average.

    Returns ``{"groups": {"<run>|<mode>|<metric label>": test}, "overall": test}`` (see
    :func:`gnll.evaluation.metrics.averaged_paired_test`); a run without per-question data
    (``None`` in ``strata_list``) leaves the rows it belongs to untested.
    """
    cfg = results_list[0]["config"] if results_list else {}
    n_boot = cfg.get("n_boot", 1000) if n_boot is None else n_boot
    seed = cfg.get("seed", 0) if seed is None else seed
    out: dict[str, Any] = {"groups": {}}
    overall: list[tuple[str, list[float], dict]] | None = []
    for (i, model, mode, label), rows in _average_groups(results_list).items():
        strata = strata_list[i]
        used = [(t, m) for t, m, mres in rows if _defined(mres)]
        if strata is None or not used:
            overall = None if strata is None else overall
            continue
        group = [(f"{i}|{model}|{t}", *strata[(t, m)]) for t, m in used]
        out["groups"][f"{i}|{mode}|{label}"] = averaged_paired_test(group, n_boot=n_boot, seed=seed)
        if overall is not None:
            overall += group
    if overall and len(out["groups"]) > 1:
        out["overall"] = averaged_paired_test(overall, n_boot=n_boot, seed=seed)
    return out


def build_results(
    samples_path: str | Path, config: Any, task_meta: dict[str, Any], components: dict[str, Any]
) -> dict[str, Any]:
    """Compute ``results.json`` from ``samples.jsonl`` (read once, keeping scores per question)."""
    rows = _read_rows(samples_path)
    strata = _strata(rows, task_meta)
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
            correct, scores = strata[(task, metric)]
            res = evaluate_measures(correct, scores, n_boot=config.n_boot, seed=config.seed)
            res["n_undecided"] = len(trs) - len(correct)
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
        extra: dict[str, Any] = {}
        if "f1" in meta["correctness"]:
            extra["f1_rule"] = {
                "rule": getattr(config, "f1_rule", "gt"),
                "disagreements": f1_rule_disagreements([r["verdicts"]["f1"] for r in trs]),
                "n": len(trs),
            }
        if "judge" in meta["correctness"]:
            extra["judge_unparseable"] = sum(
                r["verdicts"]["judge"].get("detail") == "unparseable" for r in trs
            )
        tasks_out[task] = {**meta, "metrics": metrics_out, "agreement": agreements, **extra}
    results = {
        "schema": SCHEMA,
        "model": config.model,
        "config": config.public(),
        "components": components,
        "versions": versions(),
        "tasks": tasks_out,
    }
    results["averages"] = averaged_significance([results], [strata])
    return jsonable(results, nan="none")


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


def _notes(results_list: Sequence[dict[str, Any]]) -> list[str]:
    """Header lines: evaluation pools, correctness rules and fallbacks that change the numbers."""
    out = []
    pools, rules, fallback, unparseable = [], [], [], []
    for res in results_list:
        for task, tres in res["tasks"].items():
            if tres.get("n_eval_pool") is not None:
                pools.append(
                    f"{task} {tres.get('n_eval', '?')} of {tres['n_eval_pool']:,} "
                    f"(few-shot pool {tres.get('n_fewshot_pool', '?')}, held-out pool "
                    f"{tres.get('n_heldout_pool', '?')})"
                )
            rule = tres.get("f1_rule")
            if rule:
                sym = ">" if rule["rule"] == "gt" else ">="
                rules.append(f"{task}: F1 {sym} 0.5, {rule['disagreements']} of {rule['n']} differ")
            if tres.get("mode") == "long" and "judge" not in tres.get("correctness", []):
                fallback.append(task)
            if tres.get("judge_unparseable") is not None:
                unparseable.append(f"{task}: {tres['judge_unparseable']}")
    if any(res.get("config", {}).get("reference") == "beam" for res in results_list):
        out.append(
            "**Reference answer: the most likely of the K beams** (the paper's Table 6): "
            "correctness is judged on the top beam and G-NLL / LN-G-NLL are its NLL."
        )
    if pools:
        out.append(
            "Evaluated questions of each evaluation pool: " + "; ".join(dict.fromkeys(pools))
        )
    if rules:
        out.append(
            "F1 correctness rule per task (F1 > 0.5 is the paper's, the default; `--f1_rule ge` "
            "gives the reference code's >= 0.5) and how many questions the two rules label "
            "differently: " + "; ".join(rules) + "."
        )
    if fallback:
        out.append(
            "**No judge**: " + ", ".join(dict.fromkeys(fallback)) + " are long-answer tasks scored "
            'by substring containment ("Contains"), which is not the paper\'s metric; give '
            "`--judge MODEL` for the paper's LLM-as-a-judge."
        )
    if unparseable:
        out.append(
            "Unparseable judge replies (left out of the judge rows): "
            + "; ".join(unparseable)
            + "."
        )
    return out


def _ara80_averaged(
    results_list: Sequence[dict[str, Any]],
    groups: dict[tuple[int, str, str, str], list[tuple[str, str, dict[str, Any]]]],
) -> list[str]:
    """The paper's Table 3: ARA@80 averaged over the datasets of each model x length x metric."""
    out = ["", "## Rejection accuracy at 80% averaged over datasets (↑, the paper's Table 3)", ""]
    out.append(
        "Mean ARA@80 over the tasks in the row, as the paper prints it (plus the mean accuracy)."
    )
    out.append("")
    out += _header(["Model", "Gen.", "Metric", "#tasks", "Acc."])
    for (_run, model, mode, label), rows in groups.items():
        lst = [mres for _t, _m, mres in rows if mres.get("n")]
        vals = {}
        for m in M.ORDER:
            a = [x["measures"][m]["ara80"] for x in lst if m in x["measures"]]
            if a and len(a) == len(lst) and all(v is not None for v in a):
                vals[m] = sum(a) / len(a)
        acc = [x["accuracy"] for x in lst if x.get("accuracy") is not None]
        cells = [model, mode, label, str(len(lst)), _fmt(sum(acc) / len(acc) if acc else None)]
        out.append("| " + " | ".join(cells + _row_cells(vals, None, False)) + " |")
    return out


def render_table(
    results_list: Sequence[dict[str, Any]], significance: dict[str, Any] | None = None
) -> str:
    """Markdown tables: AUROC, averages over datasets, ARA@80, AURAC, temperatures, agreement.

    ``significance`` is :func:`averaged_significance` of ``results_list``; without it the averaged
    rows use each run's own tests (``results["averages"]``) and an overall average over several runs
    carries no star.
    """
    out: list[str] = []
    out += [line + "\n" for line in _notes(results_list)]
    out.append("## AUROC (↑)")
    out.append("")
    out.append(
        "Positives are incorrect greedy answers, the score is the uncertainty; ± bootstrap "
        "standard error; best per row in bold; `*`: G-NLL significantly better than the best "
        "sampling-based measure of the "
        "paper (PE, LN-PE, SE, LN-SE, D-SE; one-sided paired bootstrap, p < 0.05). "
        "PE…MCP use N sampled answers, G-NLL and LN-G-NLL the greedy answer only, BS-MSP K beams. "
        "SE and LN-SE are the paper's Eq. (5), the Monte-Carlo form (1/N) Σ -log p(c_n); SE-RB "
        "and LN-SE-RB the plug-in form -Σ_c p(c) log p(c) of Farquhar et al.'s code."
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
    groups = _average_groups(results_list)
    if significance is None:
        significance = {"groups": {}}
        for i, res in enumerate(results_list):
            for key, test in ((res.get("averages") or {}).get("groups") or {}).items():
                significance["groups"][f"{i}|{key.split('|', 1)[1]}"] = test
            if len(results_list) == 1 and (res.get("averages") or {}).get("overall"):
                significance["overall"] = res["averages"]["overall"]
    out += ["", "## AUROC averaged over datasets (↑)", ""]
    out.append(
        "Mean over the tasks in the row (± combined standard error, sqrt(sum SE²)/k); tasks "
        "whose AUROC is undefined (a single correctness class) are left out. `*`: G-NLL "
        "significantly better than the best sampling-based measure of the row (one-sided paired "
        "bootstrap of the averaged AUROC, questions resampled within each task, p < 0.05)."
    )
    out.append("")
    out += _header(["Model", "Gen.", "Metric", "#tasks"])
    all_vals: dict[str, list[float]] = defaultdict(list)
    all_ses: dict[str, list[float]] = defaultdict(list)
    for (run, model, mode, label), full_rows in groups.items():
        full = [mres for _t, _m, mres in full_rows]
        # Tasks whose AUROCs are undefined (all answers right or all wrong) are left out of the mean.
        lst = [x for x in full if _defined(x)]
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
        star = bool(significance["groups"].get(f"{run}|{mode}|{label}", {}).get("significant"))
        out.append(
            "| " + " | ".join([model, mode, label, n_txt] + _row_cells(vals, ses, star)) + " |"
        )
    if len(groups) > 1:
        n_rows = max((len(v) for v in all_vals.values()), default=0)
        vals = {m: sum(v) / len(v) for m, v in all_vals.items() if len(v) == n_rows}
        ses = {
            m: math.sqrt(sum(x * x for x in s)) / len(s)
            for m, s in all_ses.items()
            if len(s) == n_rows
        }
        star = bool((significance.get("overall") or {}).get("significant"))
        out.append(
            "| "
            + " | ".join(["**Average**", "", "", str(n_rows)] + _row_cells(vals, ses, star))
            + " |"
        )
        if "overall" not in significance:
            out += [
                "",
                "(Overall average not tested: `gnll table` needs each run's samples.jsonl.)",
            ]

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
        if key == "ara80":
            out += _ara80_averaged(results_list, groups)

    temps = []
    for res in results_list:
        for task, tres in res["tasks"].items():
            sel = tres.get("temperature") or {}
            if sel.get("value") is None:
                continue
            cand = sel.get("candidates") or {}
            per = sel.get("per_measure") or {}
            how = sel["selected_by"]
            if how == "heldout":
                how = f"held-out, {sel.get('mode', 'shared')}"
            if cand and all(_undefined(c.get("mean_auroc")) for c in cand.values()):
                how = "default (held-out AUROC undefined)"
            chosen = (
                ", ".join(f"{M.get(m).label} {t:g}" for m, t in per.items())
                if per
                else f"{sel['value']:g}"
            )
            detail = "; ".join(
                f"T={t}: "
                + ", ".join(
                    f"{M.get(m).label} {_fmt(a)}" for m, a in (c.get("auroc") or {}).items()
                )
                for t, c in cand.items()
            )
            temps.append(f"| {res['model']} | {task} | {chosen} | {how} | {detail or '–'} |")
    if temps:
        out += ["", "## Sampling temperature", ""]
        out.append(
            "Per measure (default, `--temperature_selection per-measure`): each sampling-based "
            "measure is computed from the samples at the candidate with its own best held-out "
            "AUROC (the paper's baselines use their optimal settings); `shared`: one temperature "
            "per task, the best mean held-out AUROC of PE, LN-PE, SE, LN-SE, D-SE."
        )
        out.append("")
        out += [
            "| Model | Task | T per measure | Chosen by | Held-out AUROC per candidate |",
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
