"""The paper-style tables of one or more runs (``table.md``, ``gnll table``).

Rows are model / task / correctness metric, columns the measures in :data:`gnll.measures.ORDER`:
AUROC (with bootstrap standard errors and G-NLL's significance star), averages over datasets, ARA@80,
AURAC, the chosen temperatures and the agreement between correctness metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from gnll import measures as M
from gnll.evaluation.results.averaged import ara80_averaged, auroc_averaged
from gnll.evaluation.results.cells import SMALL_ROWS, fmt, header, row_cells, undefined
from gnll.evaluation.results.cells import columns_of as _columns
from gnll.evaluation.results.correctness import judge_index
from gnll.evaluation.results.groups import (
    PAPER_AVERAGE_ROWS,
    average_groups,
    check_average_rows,
    duplicates,
    enough_per_class,
    iter_rows,
    metric_label,
)

__all__ = ["DEFAULT_SECTIONS", "SECTIONS", "render_table"]


def _pool_source(tres: dict[str, Any]) -> str:
    """Where a task's questions came from: the hub dataset or the file, and how the pool was cut."""
    data = tres.get("data") or {}
    src = data.get("hub_id") or Path(str(data.get("file") or "")).name or data.get("source")
    if data.get("source") == "embedded":
        # the numbers are not the full benchmark's: say so where the table's pools are named
        src = f"embedded sample, {data.get('n', '?')} of the {data.get('sample_of', '?')}"
    how = data.get("eval_pool")
    return ", ".join(str(x) for x in (src, how) if x)


def _clusterer_note(res: dict[str, Any]) -> str | None:
    """Which clusterer made a run's SE / LN-SE / D-SE columns (``auto`` may have fallen back)."""
    info = (res.get("components") or {}).get("clusterer")
    if not info:
        return None
    name = info.get("clusterer") or info.get("name") or "?"
    detail = [str(info[k]) for k in ("model",) if info.get(k)]
    if info.get("threshold") is not None:
        detail.append(f"cosine >= {info['threshold']:g}")
    if info.get("relation") and name in ("nli", "llm"):
        detail.append(f"{info['relation']} entailment")
    text = f"{res['model']}: `{name}`" + (f" ({', '.join(detail)})" if detail else "")
    requested = (res.get("config") or {}).get("clusterer")
    if requested in ("auto", "default") and name != "nli":
        text += ", chosen by `auto` because no NLI model was available offline"
    if name != "nli":
        text += " -- **not NLI-based**, unlike the paper's SE"
    return text


def _notes(results_list: Sequence[dict[str, Any]]) -> list[str]:
    """Header lines: evaluation pools, clusterers, correctness rules and fallbacks that change the
    numbers."""
    out = []
    pools, rules, fallback, unparseable, clusterers = [], [], [], [], []
    for res in results_list:
        note = _clusterer_note(res)
        if note:
            clusterers.append(note)
        for task, tres in res["tasks"].items():
            if tres.get("n_eval_pool") is not None:
                source = _pool_source(tres)
                pools.append(
                    f"{task} {tres.get('n_eval', '?')} of {tres['n_eval_pool']:,} "
                    f"(few-shot pool {tres.get('n_fewshot_pool', '?')}, held-out pool "
                    f"{tres.get('n_heldout_pool', '?')}" + (f"; {source})" if source else ")")
                )
            rule = tres.get("f1_rule")
            if rule:
                sym = ">" if rule["rule"] == "gt" else ">="
                rules.append(f"{task}: F1 {sym} 0.5, {rule['disagreements']} of {rule['n']} differ")
            correctness = tres.get("correctness", [])
            if tres.get("mode") == "long" and not any(
                judge_index(m) is not None for m in correctness
            ):
                fallback.append(task)
            for metric in correctness:
                count = tres.get(f"{metric}_unparseable")
                if count is not None:
                    unparseable.append(f"{task}: {count} ({metric_label(metric, res)})")
    reasoning = [
        (res.get("model"), (res.get("components") or {}).get("model", {}).get("reasoning"))
        for res in results_list
    ]
    for model, r in dict((m, r) for m, r in reasoning if isinstance(r, dict)).items():
        out.append(
            f"**Reasoning model {model}** (`{r.get('format')}`, greedy trace of at most "
            f"{r.get('trace_budget')} tokens): every measure scores the answer after the "
            "end-of-reasoning marker, conditioned on prompt + trace; the trace is context, not "
            "scored (its NLL is in each generation's `reasoning`)."
        )
    if any(res.get("config", {}).get("reference") == "beam" for res in results_list):
        out.append(
            "**Reference answer: the most likely of the K beams** (the paper's Table 5): "
            "correctness is judged on the top beam and G-NLL / LN-G-NLL are its NLL."
        )
    if pools:
        out.append(
            "Evaluated questions of each evaluation pool, and where the pool came from: "
            + "; ".join(dict.fromkeys(pools))
        )
    if clusterers:
        out.append(
            "Semantic clusters (SE, LN-SE, D-SE, SE-RB, LN-SE-RB, MCP) made by: "
            + "; ".join(dict.fromkeys(clusterers))
            + "."
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


def _auroc(results_list: Sequence[dict[str, Any]], significance: dict[str, Any]) -> list[str]:
    """Per model, task and metric: AUROC ± bootstrap SE, G-NLL's star (the paper's Table 1 rows)."""
    out = ["## AUROC (↑)", ""]
    out.append(
        "Positives are incorrect greedy answers, the score is the uncertainty; ± bootstrap "
        "standard error; best per row in bold; `*`: G-NLL significantly better than the best "
        "sampling-based measure of the "
        "paper (PE, LN-PE, SE, LN-SE, D-SE; one-sided paired bootstrap, p < 0.05). "
        "PE…MCP use N sampled answers, G-NLL and LN-G-NLL the greedy answer only, BS-MSP K beams. "
        "SE and LN-SE are the paper's Eq. (5), the Monte-Carlo form (1/N) Σ -log p(c_n); SE-RB "
        "and LN-SE-RB the plug-in form -Σ_c p(c) log p(c) of Farquhar et al.'s code."
    )
    out += ["", SMALL_ROWS, ""]
    columns = _columns(results_list)
    out += header(["Model", "Task", "Metric", "n", "Acc."], columns)
    for res, task, _tres, metric, mres in iter_rows(results_list):
        ms = mres["measures"]
        values = {m: ms[m]["auroc"] for m in ms}
        enough = enough_per_class(mres)
        ses = {m: ms[m]["auroc_se"] for m in ms} if enough else None
        star = enough and bool(mres.get("significance", {}).get("significant"))
        cells = _task_cells(res, task, metric, mres)
        out.append("| " + " | ".join(cells + row_cells(values, ses, star, columns)) + " |")
    return out


def _task_cells(res: dict[str, Any], task: str, metric: str, mres: dict[str, Any]) -> list[str]:
    return [res["model"], task, metric_label(metric, res), str(mres["n"]), fmt(mres["accuracy"])]


def _run_significance(results_list: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The averaged rows' tests as each run recorded them (``results["averages"]``)."""
    significance: dict[str, Any] = {"groups": {}}
    for i, res in enumerate(results_list):
        for key, test in ((res.get("averages") or {}).get("groups") or {}).items():
            significance["groups"][f"{i}|{key.split('|', 1)[1]}"] = test
        if len(results_list) == 1 and (res.get("averages") or {}).get("overall"):
            significance["overall"] = res["averages"]["overall"]
            # Runs recorded before the row sets were named tested F1 and every judge.
            significance["overall_rows"] = res["averages"].get("overall_rows", "f1+judges")
    return significance


def _per_task(
    results_list: Sequence[dict[str, Any]],
    key: str,
    title: str,
    note: str,
    mark: tuple[str, str] | None = None,
) -> list[str]:
    """One column per measure of ``key`` (``ara80``, ``aurac``) for every model, task and metric.

    ``mark``: (a measure's boolean field, a sign) appended to the cells whose field is true.
    """
    out = ["", f"## {title}", "", note, ""]
    columns = _columns(results_list)
    out += header(["Model", "Task", "Metric", "n", "Acc."], columns)
    for res, task, _tres, metric, mres in iter_rows(results_list):
        ms = mres["measures"]
        values = {m: ms[m].get(key) for m in ms}  # runs recorded before PRR lack it
        cells = row_cells(values, None, False, columns)
        if mark is not None:
            field, sign = mark
            cells = [
                c + sign if m in ms and ms[m].get(field) and c != "–" else c
                for m, c in zip(columns, cells, strict=True)
            ]
        out.append("| " + " | ".join(_task_cells(res, task, metric, mres) + cells) + " |")
    return out


def _ara80(
    results_list: Sequence[dict[str, Any]],
    significance: dict[str, Any],
    rows: str = PAPER_AVERAGE_ROWS["ara80"],
) -> list[str]:
    """Rejection accuracy at 80% per task, then averaged over datasets (the paper's Table 3)."""
    note = "Accuracy on the 80% of questions with the lowest uncertainty (ties at expected value)."
    out = _per_task(results_list, "ara80", "Rejection accuracy at 80% (↑)", note)
    return out + ara80_averaged(results_list, average_groups(results_list), rows)


def _aurac(results_list: Sequence[dict[str, Any]], significance: dict[str, Any]) -> list[str]:
    """Area under the accuracy-vs-retained-fraction curve per task."""
    note = "Area under the accuracy-vs-retained-fraction curve."
    return _per_task(results_list, "aurac", "AURAC (↑)", note)


def _prr(results_list: Sequence[dict[str, Any]], significance: dict[str, Any]) -> list[str]:
    """LM-Polygraph's normalised PRR per task (an optional section: not in the default table)."""
    note = (
        "LM-Polygraph's prediction-rejection ratio with correctness as the quality, normalised: "
        "(PRR − random) / (oracle − random), 1 for the oracle ranking, 0 for a random one "
        "(`results.json` also has `prr`, `prr_0.5` and `prr_0.5_normalized`)."
    )
    note += (
        " **†**: the measure has tied scores across right and wrong answers (D-SE's few distinct "
        "values, for instance), and LM-Polygraph breaks such ties by the order of the records, so "
        "this number changes when the same answers come in another order; the next table is "
        "order-invariant."
    )
    out = _per_task(
        results_list,
        "prr_normalized",
        "Normalised PRR (↑, LM-Polygraph's)",
        note,
        mark=("prr_order_dependent", "†"),
    )
    if not any(
        "prr_normalized_tie_averaged" in v
        for _r, _t, _tr, _m, mres in iter_rows(results_list)
        for v in mres["measures"].values()
    ):
        return out  # a run recorded before the tie-averaged PRR
    tied = (
        "gnll's companion, not LM-Polygraph's: the same normalised PRR with tied scores at their "
        "expected value (the mean over every order of the records) and the exact random "
        "baseline, so the same answers give the same number in any order; equal to the one "
        "above, up to the random baseline's estimate, for a measure without †."
    )
    title = "Normalised PRR, ties averaged (↑, order-invariant)"
    return out + _per_task(results_list, "prr_normalized_tie_averaged", title, tied)


def _temperature_row(res: dict[str, Any], task: str, sel: dict[str, Any]) -> str:
    cand = sel.get("candidates") or {}
    per = sel.get("per_measure") or {}
    how = sel["selected_by"]
    if how == "heldout":
        how = f"held-out, {sel.get('mode', 'shared')}"
    if sel.get("single_class") or (
        cand and all(undefined(c.get("mean_auroc")) for c in cand.values())
    ):
        how = "default (held-out AUROC undefined)"
    chosen = (
        ", ".join(f"{M.get(m).label} {t:g}" for m, t in per.items()) if per else f"{sel['value']:g}"
    )
    detail = "; ".join(
        f"T={t}: "
        + ", ".join(f"{M.get(m).label} {fmt(a)}" for m, a in (c.get("auroc") or {}).items())
        for t, c in cand.items()
    )
    return f"| {res['model']} | {task} | {chosen} | {how} | {detail or '–'} |"


def _temperatures(
    results_list: Sequence[dict[str, Any]], significance: dict[str, Any]
) -> list[str]:
    """The sampling temperature of each task and how it was chosen (absent if none was needed)."""
    temps = [
        _temperature_row(res, task, tres["temperature"])
        for res in results_list
        for task, tres in res["tasks"].items()
        if (tres.get("temperature") or {}).get("value") is not None
    ]
    if not temps:
        return []
    out = ["", "## Sampling temperature", ""]
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
    ]
    return out + temps


def _agreement(results_list: Sequence[dict[str, Any]], significance: dict[str, Any]) -> list[str]:
    """Agreement rate and Cohen's kappa between correctness metrics (absent with one metric)."""
    agree = [
        f"| {res['model']} | {task} | {pair.replace('_vs_', ' vs ')} | {a['n']} | "
        f"{fmt(a['agreement'])} | {fmt(a['kappa'])} |"
        for res in results_list
        for task, tres in res["tasks"].items()
        for pair, a in (tres.get("agreement") or {}).items()
    ]
    if not agree:
        return []
    out = ["", "## Agreement between correctness metrics", ""]
    out.append(
        "How far to trust a small judge: agreement rate and Cohen's kappa on the "
        "questions both metrics decided."
    )
    out.append("")
    out += ["| Model | Task | Metrics | n | Agreement | Cohen's κ |", "|---|---|---|---|---|---|"]
    return out + agree


def _header_notes(
    results_list: Sequence[dict[str, Any]], significance: dict[str, Any]
) -> list[str]:
    return [line + "\n" for line in _notes(results_list)]


Section = Callable[[Sequence[dict[str, Any]], dict[str, Any]], list[str]]

#: The sections of ``table.md`` in order; :func:`render_table` takes any subset by name.
SECTIONS: dict[str, Section] = {
    "notes": _header_notes,
    "auroc": _auroc,
    "auroc_averaged": auroc_averaged,
    "ara80": _ara80,
    "aurac": _aurac,
    "temperature": _temperatures,
    "agreement": _agreement,
    "prr": _prr,
}

#: The sections :func:`render_table` renders by default (``table.md``): all but the optional ``prr``.
DEFAULT_SECTIONS: tuple[str, ...] = tuple(n for n in SECTIONS if n != "prr")


def render_table(
    results_list: Sequence[dict[str, Any]],
    significance: dict[str, Any] | None = None,
    *,
    sections: Sequence[str] | None = None,
    run_labels: Sequence[str] | None = None,
    average_rows: str | None = None,
) -> str:
    """Markdown tables: AUROC, averages over datasets, ARA@80, AURAC, temperatures, agreement.

    Parameters
    ----------
    results_list
        One ``results.json`` dictionary per run (:func:`gnll.evaluation.run_evaluation` returns one).
    significance
        :func:`~gnll.evaluation.results.report.averaged_significance` of ``results_list``; without
        it the averaged rows use each run's own tests (``results["averages"]``) and an overall
        average over several runs carries no star.
    sections
        Names from :data:`SECTIONS` to render, in table order (default: :data:`DEFAULT_SECTIONS`,
        all but ``"prr"``, LM-Polygraph's normalised PRR, which ``gnll table --prr`` adds).
        ``gnll eval`` prints ``("notes", "auroc")``.
    run_labels
        One name per run (``gnll table``: the run directories). Two runs holding the same model and
        task are refused without them (an average would count one dataset twice); with them, those
        runs' rows are labelled ``model (run)`` and the overall average is left out.
    average_rows
        The rows every overall **Average** spans, a key of
        :data:`~gnll.evaluation.results.groups.AVERAGE_ROWS`. Default: the paper's set per table
        (:data:`~gnll.evaluation.results.groups.PAPER_AVERAGE_ROWS`): F1 and the first judge for the
        AUROC table (Tables 1 and 5), F1 and every judge for ARA@80 (Table 3). Each table's heading
        names its set. The AUROC Average's star needs ``significance`` computed over the same rows.

    Returns
    -------
    str
        The Markdown text, ending with a newline.
    """
    names = list(DEFAULT_SECTIONS) if sections is None else list(sections)
    check_average_rows(average_rows)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise ValueError(f"unknown table sections {unknown}; known: {', '.join(SECTIONS)}")
    dup = duplicates(results_list)
    if dup:
        (model, task), runs = next(iter(dup.items()))
        if run_labels is None:
            raise ValueError(
                f"runs {', '.join(str(i + 1) for i in runs)} both hold {model} / {task}: averaging "
                "them would count one dataset twice; give each model and task once"
            )
        clash = {i for runs in dup.values() for i in runs}
        results_list = [
            {**res, "model": f"{res['model']} ({run_labels[i]})", "labelled_from": res["model"]}
            if i in clash
            else res
            for i, res in enumerate(results_list)
        ]
    if significance is None:
        significance = _run_significance(results_list)
    out: list[str] = []
    for name in SECTIONS:
        if name in names:
            section = SECTIONS[name]
            if name in PAPER_AVERAGE_ROWS:
                section = partial(section, rows=average_rows or PAPER_AVERAGE_ROWS[name])
            out += section(results_list, significance)
    return "\n".join(out) + "\n"
