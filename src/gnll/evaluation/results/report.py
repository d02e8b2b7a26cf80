"""Results of a run (``results.json``), computed from its ``samples.jsonl``.

``results.json`` holds, per task and correctness metric, the number of questions, the accuracy of the
greedy answers, and per measure its AUROC with bootstrap standard error, ARA@80, AURAC, the mean
number of generated tokens it needs per question and LM-Polygraph's PRR numbers (``prr``,
``prr_0.5`` and their ``_normalized`` forms, :func:`~gnll.evaluation.results.metrics.prr_metrics`
with correctness as the quality) with gnll's order-invariant companions (:data:`PRR_TIE_KEYS`);
for ``g-nll+eos``, ``eos_at_step_le_2``, the answers on which it is not LM-Polygraph's MSP; the paired bootstrap test of G-NLL against the best
sampling-based measure; the sampling temperature and how it was chosen; agreement between correctness
metrics; and the full configuration with seeds and library versions. It is deterministic: run it twice
(or resume an interrupted run) and the file is byte-identical.

:func:`gnll.evaluation.results.tables.render_table` lays one or more results out like the paper's Table 1.
"""

from __future__ import annotations

import platform
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gnll import measures as M
from gnll._util import jsonable, read_json
from gnll._util.runfiles import RunDir, iter_samples
from gnll.evaluation.results.correctness import agreement, f1_rule_disagreements, judge_index
from gnll.evaluation.results.groups import (
    PAPER_AVERAGE_ROWS,
    average_groups,
    defined,
    overall_keys,
)
from gnll.evaluation.results.metrics import (
    averaged_paired_test,
    evaluate_measures,
    prr_metrics,
    prr_order_dependent,
    tie_averaged_prr,
)

__all__ = [
    "PRR_KEYS",
    "PRR_TIE_KEYS",
    "SCHEMA",
    "ReportOptions",
    "averaged_significance",
    "build_results",
    "load_results",
    "read_rows",
    "read_strata",
    "versions",
]

SCHEMA = "gnll.eval.results/1"


def versions() -> dict[str, str]:
    """Versions of Python and the libraries that shape results."""
    out = {"python": platform.python_version()}
    import importlib
    from importlib.metadata import PackageNotFoundError, version

    for mod in ("gnll", "numpy", "scipy", "sklearn"):
        try:
            out[mod] = str(importlib.import_module(mod).__version__)
        except Exception:  # noqa: BLE001 - a missing optional library is simply not recorded
            continue
    # Read from the installed distributions: a process that ran no model (a Ray driver, whose
    # replicas did) does not import torch and transformers for their version numbers.
    for dist in ("torch", "transformers"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            continue
    return out


def read_rows(samples_path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """Per task, each question's verdicts, measures and token costs (one pass over ``samples.jsonl``)."""
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for _lineno, r in iter_samples(samples_path):
        rows[r["task"]].append(
            {
                "verdicts": r["correctness"],
                "correct": {m: v.get("correct") for m, v in r["correctness"].items()},
                "measures": r["measures"],
                "cost": r.get("cost_tokens", {}),
                "eos_early": _eos_early(r.get("greedy")),
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
        names = [m for m in M.WITH_VARIANTS if trs and all(m in row["measures"] for row in trs)]
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
    samples = RunDir(run_dir).samples
    if not samples.exists():
        return None
    res = load_results(run_dir)
    meta = {t: {"correctness": list(v["metrics"])} for t, v in res["tasks"].items()}
    return _strata(read_rows(samples), meta)


def averaged_significance(
    results_list: Sequence[dict[str, Any]],
    strata_list: Sequence[dict[tuple[str, str], tuple[list[float], dict]] | None],
    *,
    n_boot: int | None = None,
    seed: int | None = None,
    average_rows: str = PAPER_AVERAGE_ROWS["auroc_averaged"],
) -> dict[str, Any]:
    """Stratified paired tests of G-NLL on every dataset-averaged row and on the overall average.

    Returns ``{"groups": {"<run>|<mode>|<metric label>": test}, "overall": test, "overall_rows":
    average_rows}`` (see :func:`gnll.evaluation.results.metrics.averaged_paired_test`); the overall
    test spans the rows ``average_rows`` names (:data:`~gnll.evaluation.results.groups.AVERAGE_ROWS`;
    default the paper's Table 1 rows, F1 and the first judge). A run without per-question data
    (``None`` in ``strata_list``) leaves the rows it belongs to untested.
    """
    cfg = results_list[0]["config"] if results_list else {}
    n_boot = cfg.get("n_boot", 1000) if n_boot is None else n_boot
    seed = cfg.get("seed", 0) if seed is None else seed
    out: dict[str, Any] = {"groups": {}, "overall_rows": average_rows}
    overall: list[tuple[str, list[float], dict]] | None = []
    weights: list[float] = []  # each row once, as the table's Average weighs it
    groups = average_groups(results_list)
    in_overall = set(overall_keys(groups, average_rows))
    for (i, model, mode, label), rows in groups.items():
        strata = strata_list[i]
        used = [(t, m) for t, m, mres in rows if defined(mres)]
        if strata is None or not used:
            overall = None if strata is None else overall
            continue
        group = [(f"{i}|{model}|{t}", *strata[(t, m)]) for t, m in used]
        out["groups"][f"{i}|{mode}|{label}"] = averaged_paired_test(group, n_boot=n_boot, seed=seed)
        if overall is not None and (i, model, mode, label) in in_overall:
            overall += group
            weights += [1 / len(group)] * len(group)
    if overall and len(in_overall) > 1:
        # equal rows test as before (bit for bit); rows of different sizes weigh each row once
        w = None if len(set(weights)) == 1 else weights
        out["overall"] = averaged_paired_test(overall, n_boot=n_boot, seed=seed, weights=w)
    return out


#: LM-Polygraph's PRR numbers as ``results.json`` names them (``None`` below two decided questions).
PRR_KEYS = ("prr", "prr_normalized", "prr_0.5", "prr_0.5_normalized")


def _prr(uncertainty: Sequence[float], correct: Sequence[float]) -> dict[str, float | None]:
    """LM-Polygraph's PRR metrics of one measure, correctness (0/1) as the quality."""
    if len(correct) < 2:  # nothing to reject at half the questions
        return dict.fromkeys(PRR_KEYS)
    values = prr_metrics(uncertainty, correct)
    return {k: values[k] for k in PRR_KEYS}


#: gnll's order-invariant companions of the PRR (``None`` below two decided questions):
#: ``prr_order_dependent`` says whether LM-Polygraph's PRR of the measure can change with the order
#: of the records (a tie joins a right and a wrong answer), ``prr_tie_averaged`` and
#: ``prr_normalized_tie_averaged`` are the PRR with ties at their expected value.
PRR_TIE_KEYS = ("prr_order_dependent", "prr_tie_averaged", "prr_normalized_tie_averaged")


def _prr_ties(uncertainty: Sequence[float], correct: Sequence[float]) -> dict[str, Any]:
    if len(correct) < 2:
        return dict.fromkeys(PRR_TIE_KEYS)
    tied = tie_averaged_prr(uncertainty, correct)
    return {
        "prr_order_dependent": prr_order_dependent(uncertainty, correct),
        "prr_tie_averaged": tied["prr"],
        "prr_normalized_tie_averaged": tied["prr_normalized"],
    }


def _eos_early(greedy: dict[str, Any] | None) -> bool:
    """Whether a greedy answer ended with an EOS token at generation step 1 or 2 (empty, or one
    token and EOS): there LM-Polygraph, which masks EOS in those steps (``min_new_tokens=2``),
    generates a different, longer answer, so ``g-nll+eos`` is not its MSP."""
    if not greedy:
        return False
    return greedy.get("finish_reason") == "eos" and len(greedy.get("token_ids") or []) <= 1


@dataclass(frozen=True)
class ReportOptions:
    """What :func:`build_results` needs of a run's configuration (the results wing does not import
    the run wing: the runner builds this from its ``EvalConfig``).

    Attributes
    ----------
    model:
        The evaluated model's name.
    config:
        The configuration as recorded in results (``EvalConfig.public()``).
    n_boot, seed:
        Bootstrap resamples and seed of the standard errors and significance tests.
    f1_rule:
        The F1 correctness rule (``gt`` or ``ge``).
    """

    model: str
    config: dict[str, Any]
    n_boot: int
    seed: int
    f1_rule: str = "gt"


def build_results(
    samples_path: str | Path,
    options: ReportOptions,
    task_meta: dict[str, Any],
    components: dict[str, Any],
) -> dict[str, Any]:
    """Compute ``results.json`` from ``samples.jsonl`` (read once, keeping scores per question)."""
    config = options
    rows = read_rows(samples_path)
    strata = _strata(rows, task_meta)
    tasks_out: dict[str, Any] = {}
    for task, meta in task_meta.items():
        trs = rows.get(task, [])
        metrics_out: dict[str, Any] = {}
        names = [m for m in M.WITH_VARIANTS if trs and all(m in row["measures"] for row in trs)]
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
                res["measures"][m].update(_prr(scores[m], correct))
                res["measures"][m].update(_prr_ties(scores[m], correct))
            if M.G_NLL_EOS in names:  # where LM-Polygraph's MSP is of another answer
                decided = [row for row in trs if row["correct"].get(metric) is not None]
                res["measures"][M.G_NLL_EOS]["eos_at_step_le_2"] = sum(
                    row["eos_early"] for row in decided
                )
            metrics_out[metric] = res
        agreements = {}
        judged = [m for m in meta["correctness"] if judge_index(m) is not None]
        present = [m for m in ("f1", "contains") if m in meta["correctness"]] + judged
        for i, a in enumerate(present):
            for b in present[i + 1 :]:
                agreements[f"{a}_vs_{b}"] = agreement(
                    [row["correct"].get(a) for row in trs], [row["correct"].get(b) for row in trs]
                )
        extra: dict[str, Any] = {}
        if "f1" in meta["correctness"]:
            extra["f1_rule"] = {
                "rule": config.f1_rule,
                "disagreements": f1_rule_disagreements([r["verdicts"]["f1"] for r in trs]),
                "n": len(trs),
            }
        for m in judged:  # judge_unparseable, judge2_unparseable, ...
            extra[f"{m}_unparseable"] = sum(
                r["verdicts"][m].get("detail") == "unparseable" for r in trs
            )
        tasks_out[task] = {**meta, "metrics": metrics_out, "agreement": agreements, **extra}
    results = {
        "schema": SCHEMA,
        "model": config.model,
        "config": config.config,
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
        p = RunDir(p).results
    if not p.exists():
        raise FileNotFoundError(
            f"{p} not found: is {path} the --output of a finished `gnll eval` run?"
        )
    data = read_json(p)
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{p}: not a gnll eval results file (schema {data.get('schema')!r})")
    return data
