"""Labelled uncertainty scores for calibration: from ``gnll eval`` runs or a scored file.

An eval run directory (or its ``samples.jsonl``) gives one row per question: the measure from
``record["measures"]`` and the verdict ``record["correctness"][metric]["correct"]`` (the task's primary
metric unless one is named). A scored file (JSONL, CSV or Parquet, e.g. the output of ``gnll score``)
gives the measure column (``g-nll`` is looked up as ``g_nll`` too) and a ``correct`` or ``label``
column.

Examples
--------
>>> fp = prompt_fingerprint("Answer briefly.\\nQuestion: {question}\\nAnswer:")
>>> fp.startswith("sha256:"), len(fp), fp == prompt_fingerprint("Answer briefly.\\nQuestion: {question}\\nAnswer:")
(True, 19, True)
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gnll._util import read_json
from gnll._util.runfiles import SAMPLES, RunDir, iter_samples, samples_path
from gnll._util.tabular import file_format

__all__ = ["LabelledScores", "load_labelled", "prompt_fingerprint"]

LABEL_COLUMNS = ("correct", "label")
TRUE_STRINGS = {"1", "true", "yes", "correct", "t", "y"}
FALSE_STRINGS = {"0", "false", "no", "incorrect", "f", "n"}


def prompt_fingerprint(template: str) -> str:
    """Short hash of a prompt template (user text with the question as ``{question}``).

    Calibration files record it; using a file with prompts built from another template warns,
    because the same G-NLL can mean a different P(correct) under another instruction or few-shot
    prefix.
    """
    return "sha256:" + hashlib.sha256(template.encode("utf-8")).hexdigest()[:12]


@dataclass
class LabelledScores:
    """Scores, 0/1 labels and where they came from."""

    scores: np.ndarray
    labels: np.ndarray
    sources: list[dict[str, Any]] = field(default_factory=list)
    model: str | None = None
    prompt_fingerprint: str | None = None
    #: The answers' :mod:`prompt format <gnll.backends.prompting>` (``None``: unknown or mixed).
    prompt_format: str | None = None
    prompt_description: str | None = None
    dropped: int = 0
    #: Which tokens the scores cover: ``"answer"`` (a reasoning model's answer after its
    #: end-of-reasoning marker, the trace as context), ``"output"`` (no reasoning), ``None``: mixed.
    scored: str | None = "output"


def _label(value: Any, where: str) -> float:
    if isinstance(value, bool | np.bool_):
        return float(value)
    if isinstance(value, int | float | np.integer | np.floating) and value in (0, 1):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in TRUE_STRINGS | FALSE_STRINGS:
        return float(value.strip().lower() in TRUE_STRINGS)
    raise ValueError(f"{where}: label {value!r} is not 0/1 or true/false")


def _score(value: Any) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return math.nan
    return x


def _read_run(path: Path, measure: str, correctness: str | None) -> tuple[list, list, dict, int]:
    run_dir = path.parent if path.is_file() else path
    samples = samples_path(path)
    if not samples.exists():
        raise FileNotFoundError(f"{path}: no {SAMPLES} (is this a finished `gnll eval` run?)")
    scores, labels, tasks, metrics, dropped = [], [], {}, set(), 0
    scored: set[str] = set()
    for lineno, r in iter_samples(samples):
        where = f"{samples}:{lineno}"
        scored.add("answer" if (r.get("greedy") or {}).get("reasoning") else "output")
        if measure not in r.get("measures", {}):
            have = ", ".join(r.get("measures", {})) or "none"
            raise ValueError(f"{where}: measure {measure!r} not in this run (it has: {have})")
        corr = r.get("correctness", {})
        metric = correctness or next(iter(corr), None)
        if metric not in corr:
            raise ValueError(f"{where}: correctness {metric!r} missing (it has: {', '.join(corr)})")
        v = corr[metric].get("correct")
        s = _score(r["measures"][measure])
        if v is None or not math.isfinite(s):
            dropped += 1
            continue
        scores.append(s)
        labels.append(_label(v, where))
        metrics.add(metric)
        tasks[r.get("task", "?")] = tasks.get(r.get("task", "?"), 0) + 1
    info: dict[str, Any] = {
        "path": str(path),
        "kind": "gnll eval run",
        "tasks": tasks,
        "correctness": sorted(metrics),
        "scored": sorted(scored),
    }
    run_json = RunDir(run_dir).run_json
    if run_json.exists():
        info["model"] = read_json(run_json)["config"].get("model")
    info["prompt_templates"] = run_prompt_templates(run_dir, tasks)
    return scores, labels, info, dropped


def run_prompt_templates(run_dir: Path, tasks: Iterable[str]) -> dict[str, str]:
    """The prompt template of each task of a ``gnll eval`` run (its few-shot prefix and question)."""
    templates = {}
    for task in sorted(tasks):
        fp = run_dir / "tasks" / task / "fingerprint.json"
        if fp.exists():
            prefix = read_json(fp).get("prompt_prefix", "")
            templates[task] = prefix + "Question: {question}\nAnswer:"
    return templates


def templates_fingerprint(templates: dict[str, str]) -> tuple[str | None, str | None]:
    """One fingerprint and description of a run's prompt templates (``None`` without any)."""
    if not templates:
        return None, None
    joined = "\n---\n".join(f"{t}:\n{templates[t]}" for t in sorted(templates))
    fp = (
        prompt_fingerprint(joined)
        if len(templates) > 1
        else prompt_fingerprint(next(iter(templates.values())))
    )
    return fp, _describe_eval_prompts(templates)


def _read_table(path: Path, measure: str) -> tuple[list, list, dict, int]:
    import pandas as pd

    fmt = file_format(path)
    if fmt == "jsonl":
        df = pd.read_json(path, lines=True)
    elif fmt == "csv":
        df = pd.read_csv(path)
    else:
        df = pd.read_parquet(path)
    col = next((c for c in (measure, measure.replace("-", "_")) if c in df.columns), None)
    if col is None:
        raise ValueError(
            f"{path}: no column {measure!r} (columns: {', '.join(map(str, df.columns))}); pass --measure"
        )
    lab = next((c for c in LABEL_COLUMNS if c in df.columns), None)
    if lab is None:
        raise ValueError(
            f"{path}: no label column ({' or '.join(LABEL_COLUMNS)}) to calibrate against"
        )
    scores, labels, dropped = [], [], 0
    for i, (s, v) in enumerate(zip(df[col], df[lab], strict=True)):
        s = _score(s)
        if v is None or (isinstance(v, float) and math.isnan(v)) or not math.isfinite(s):
            dropped += 1
            continue
        scores.append(s)
        labels.append(_label(v, f"{path}: row {i + 1}"))
    info = {"path": str(path), "kind": "scored file", "column": col, "label_column": lab}
    if "model" in df.columns and df["model"].nunique() == 1:
        info["model"] = str(df["model"].iloc[0])
    if "prompt_format" in df.columns:  # gnll ask --json and gnll score write it
        info["prompt_formats"] = sorted(map(str, df["prompt_format"].dropna().unique()))
    # gnll score and serve say "scored": "answer" for a reasoning model's answers
    has = "scored" in df.columns
    info["scored"] = (
        sorted({"answer" if v == "answer" else "output" for v in df["scored"]})
        if has
        else ["output"]
    )
    return scores, labels, info, dropped


def _describe_eval_prompts(templates: dict[str, str]) -> str:
    """``gnll eval's 5-shot triviaqa_short prompts``: what a calibration fitted on runs was fitted on
    (the examples in a task's prompt each start with "Question:"; the asked question is one more)."""
    shots = {t: templates[t].count("Question:") - 1 for t in sorted(templates)}
    if len(set(shots.values())) == 1:
        return f"gnll eval's {next(iter(shots.values()))}-shot {', '.join(shots)} prompts"
    return "gnll eval's prompts of " + ", ".join(f"{t} ({k}-shot)" for t, k in shots.items())


def load_labelled(
    paths: list[str | Path], *, measure: str = "g-nll", correctness: str | None = None
) -> LabelledScores:
    """Read and pool labelled scores from eval run directories and/or scored files.

    Rows whose score is missing/NaN or whose label is unknown are dropped and counted.
    """
    all_s: list[float] = []
    all_y: list[float] = []
    sources, models, templates, dropped = [], set(), {}, 0
    formats: set[str | None] = set()
    scored: set[str] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"{p} does not exist")
        if p.is_dir() or p.name == SAMPLES:
            s, y, info, d = _read_run(p, measure, correctness)
            templates.update(info.pop("prompt_templates"))
            formats.add("instruction")  # gnll eval's task prompts
        else:
            s, y, info, d = _read_table(p, measure)
            found = info.get("prompt_formats") or [None]
            formats.update(found)
        scored.update(info.get("scored") or ["output"])
        info["n"] = len(s)
        info["n_correct"] = int(sum(y))
        info["dropped"] = d
        sources.append(info)
        if info.get("model"):
            models.add(info["model"])
        all_s += s
        all_y += y
        dropped += d
    fp, description = templates_fingerprint(templates)
    return LabelledScores(
        scores=np.asarray(all_s, dtype=np.float64),
        labels=np.asarray(all_y, dtype=np.float64),
        sources=sources,
        model=models.pop() if len(models) == 1 else (", ".join(sorted(models)) or None),
        prompt_fingerprint=fp,
        prompt_format=formats.pop() if len(formats) == 1 else None,
        prompt_description=description,
        dropped=dropped,
        scored=scored.pop() if len(scored) == 1 else None,
    )
