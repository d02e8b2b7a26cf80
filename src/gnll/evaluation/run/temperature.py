"""Choosing the sampling temperature on the held-out pool (the paper's protocol).

``per-measure`` (default): every sampling-based measure gets the candidate with its own best
held-out AUROC under the primary correctness metric (the paper's baselines use "their optimal
hyperparameter settings", Sec. 5.2; App. D tunes the temperature per dataset). ``shared``: one
temperature per task, the best mean AUROC of the paper's baselines (PE, LN-PE, SE, LN-SE, D-SE; MCP
and the plug-in SE forms are not among them). Ties go to the first candidate; an undefined AUROC (a
single correctness class) falls back to 1.0 (:func:`default_temperature`). The runner judges the
held-out answers first and, when they are all right or all wrong, takes that fallback without
sampling them.

``--temperature_scope dataset`` (the presets' default) chooses once per dataset, as App. D does ("for
each dataset"): the short and long tasks of a dataset in one run share the choice, made on the mean of
their held-out AUROCs (:func:`pool_tables`). ``task`` (the CLI default) chooses for each task alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gnll.evaluation.results.metrics import auroc
from gnll.evaluation.run.config import EvalConfig

__all__ = [
    "SCOPES",
    "SELECTION_MODES",
    "choose_from_tables",
    "choose_temperature",
    "choose_temperatures",
    "default_temperature",
    "heldout_size",
    "pool_tables",
]

SELECTION_MODES = ("per-measure", "shared")
#: What one temperature choice covers: a task, or a dataset (its short and long tasks together).
SCOPES = ("task", "dataset")


def heldout_size(cfg: EvalConfig, available: int) -> int:
    """How many held-out questions choose the temperature (``--heldout_size``, else
    ``min(100, limit)``), bounded by the ``available`` pool."""
    wanted = cfg.heldout_size if cfg.heldout_size is not None else min(100, cfg.limit or 100)
    n = min(wanted, available)
    if n < 2:
        raise ValueError(
            "temperature selection needs a held-out pool; give --temperature or --heldout_size >= 2"
        )
    return n


def default_temperature(candidates: Sequence[float]) -> float:
    """The temperature used when the held-out AUROCs cannot rank the candidates: 1.0 (the model's
    own distribution) if it is one of them, else the first.

    >>> default_temperature((0.5, 1.0, 1.5)), default_temperature((0.7, 1.3))
    (1.0, 0.7)
    """
    return 1.0 if 1.0 in candidates else candidates[0]


def choose_temperature(
    candidates: Sequence[float],
    records: Mapping[float, Iterable[dict[str, Any]]],
    metric: str,
    measures: Sequence[str],
) -> tuple[float, dict[str, Any]]:
    """The best of ``candidates`` and the table it was chosen from.

    ``records[t]`` are the held-out ``samples.jsonl``-style records at temperature ``t`` (with
    ``correctness`` and ``measures``); questions whose ``metric`` verdict is undecided are left out.
    """
    table: dict[str, Any] = {}
    for temp in candidates:
        correct: list[float] = []
        scores: dict[str, list[float]] = {m: [] for m in measures}
        for r in records[temp]:
            c = r["correctness"][metric]["correct"]
            if c is None:
                continue
            correct.append(float(c))
            for m in measures:
                scores[m].append(r["measures"][m])
        aucs = {m: auroc(correct, scores[m]) if correct else float("nan") for m in measures}
        finite = [a for a in aucs.values() if not math.isnan(a)]
        table[f"{temp:g}"] = {
            "auroc": aucs,
            "mean_auroc": sum(finite) / len(finite) if finite else float("nan"),
            "n": len(correct),
            "accuracy": sum(correct) / len(correct) if correct else float("nan"),
        }
    return _best(candidates, table, "mean_auroc")


def _best(candidates: Sequence[float], table: dict[str, Any], *key: str) -> tuple[float, dict]:
    def value(t: float) -> float:
        v: Any = table[f"{t:g}"]
        for k in key:
            v = v[k]
        return float("nan") if v is None else float(v)

    finite_t = [t for t in candidates if not math.isnan(value(t))]
    if finite_t:
        best = max(finite_t, key=value)  # first of ties
        note = "best held-out AUROC"
    else:
        best = default_temperature(candidates)
        note = "held-out pool has a single correctness class; fell back to the default temperature"
    return best, {"candidates": table, "note": note}


def choose_temperatures(
    candidates: Sequence[float],
    records: Mapping[float, Iterable[dict[str, Any]]],
    metric: str,
    measures: Sequence[str],
    mode: str = "per-measure",
    shared_by: Sequence[str] = ("pe", "ln-pe", "se", "ln-se", "d-se"),
) -> tuple[dict[str, float], dict[str, Any]]:
    """The temperature of every measure in ``measures`` and the table it was chosen from.

    ``mode="per-measure"``: each measure's own best candidate; ``"shared"``: the candidate with the
    best mean AUROC of the ``shared_by`` measures present (all of ``measures`` if none is).

    >>> recs = {t: [{"correctness": {"f1": {"correct": c}},
    ...              "measures": {"pe": s * (1 if t == 0.5 else -1), "se": s * (1 if t == 1.0 else -1)}}
    ...             for c, s in [(True, 0.1), (False, 0.9), (True, 0.2), (False, 0.8)]]
    ...         for t in (0.5, 1.0)}
    >>> choose_temperatures((0.5, 1.0), recs, "f1", ["pe", "se"])[0]
    {'pe': 0.5, 'se': 1.0}
    """
    _, info = choose_temperature(candidates, records, metric, measures)
    return choose_from_tables(candidates, [info["candidates"]], measures, mode, shared_by)


def pool_tables(tables: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One candidate table from several tasks' (:func:`choose_temperature`'s ``candidates``).

    Per candidate and measure the mean of the tasks' defined held-out AUROCs (a task whose AUROC is
    undefined is left out of that mean); ``n`` is the total of decided questions.

    >>> a = {"1": {"auroc": {"pe": 0.6}, "n": 10}}
    >>> b = {"1": {"auroc": {"pe": 0.8}, "n": 5}}
    >>> pool_tables([a, b])["1"]["auroc"]["pe"], pool_tables([a, b])["1"]["n"]
    (0.7, 15)
    """
    if len(tables) == 1:
        return tables[0]
    out: dict[str, Any] = {}
    for key in tables[0]:
        rows = [t[key] for t in tables]
        aucs = {}
        for m in rows[0]["auroc"]:
            finite = [r["auroc"][m] for r in rows if not math.isnan(_nan(r["auroc"][m]))]
            aucs[m] = sum(finite) / len(finite) if finite else float("nan")
        out[key] = {"auroc": aucs, "n": sum(r.get("n", 0) for r in rows), "tasks": len(rows)}
    return out


def _nan(v: float | None) -> float:
    return float("nan") if v is None else float(v)


def choose_from_tables(
    candidates: Sequence[float],
    tables: Sequence[dict[str, Any]],
    measures: Sequence[str],
    mode: str = "per-measure",
    shared_by: Sequence[str] = ("pe", "ln-pe", "se", "ln-se", "d-se"),
) -> tuple[dict[str, float], dict[str, Any]]:
    """:func:`choose_temperatures` from held-out AUROC tables, pooled over tasks (:func:`pool_tables`)."""
    if mode not in SELECTION_MODES:
        raise ValueError(f"temperature selection must be one of {SELECTION_MODES}, got {mode!r}")
    judged = [m for m in measures if m in shared_by] or list(measures)
    table = pool_tables(tables)
    for row in table.values():
        finite = [row["auroc"][m] for m in judged if not math.isnan(_nan(row["auroc"][m]))]
        row["mean_auroc"] = sum(finite) / len(finite) if finite else float("nan")
    out: dict[str, float] = {}
    notes: dict[str, str] = {}
    if mode == "shared":
        best, info = _best(candidates, table, "mean_auroc")
        out = {m: best for m in measures}
        notes = {m: info["note"] for m in measures}
    else:
        for m in measures:
            out[m], mi = _best(candidates, table, "auroc", m)
            notes[m] = mi["note"]
    return out, {
        "candidates": table,
        "mode": mode,
        "mean_of": judged,
        "per_measure": out,
        "notes": notes,
    }
