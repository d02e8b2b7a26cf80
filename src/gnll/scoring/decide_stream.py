"""The ``gnll decide`` file job: rows of ``input`` + ``questions`` in, their decisions out.

It runs on the ``gnll score`` machinery (:func:`gnll.scoring.stream.run_score_job` with its own
chunk mapper): streaming in chunks, output rows written in order with their ``input_line``,
``--resume`` after the last written row, an existing output never clobbered, and rows that cannot
be decided (no ``input``, bad questions, a model error) written to the errors file with their line.

An output row is the input row (``id``, ``labels`` and any other field kept) plus ``input_line``,
``model`` and ``answers``: each answer as :meth:`gnll.scoring.decisions.DecisionAnswer.to_dict`
gives it (the OpenAI Decisions shape with every option's probability, log-prob and NLL, the
options' mass, and a refusal's reason). Labelled rows (a ``labels`` list, one gold value per
question) are what ``gnll calibrate --decisions`` fits on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from gnll.backends.base import Model
from gnll.scoring.api import ScoringError
from gnll.scoring.decisions import DecisionAnswer, DecisionError, decide
from gnll.scoring.rows import Row
from gnll.scoring.stream import ChunkResult, ScoreJob, ScoreSummary, run_score_job

__all__ = ["DECIDE_COLUMNS", "decide_chunk", "run_decide_job"]

#: What every ``gnll decide`` row needs.
DECIDE_COLUMNS = (("input",), ("questions",))

#: Applied to every answer before it is written (a decisions calibration's ``apply``).
AnswerHook = Callable[[DecisionAnswer], DecisionAnswer]


def _decide_row(
    model: Model, line: int, row: dict[str, Any], min_mass: float, hook: AnswerHook | None
) -> dict[str, Any] | str:
    if "input" not in row:
        return "missing field 'input'"
    if not isinstance(row.get("questions"), list):
        return "field 'questions' must be a list of question objects"
    labels = row.get("labels")
    if labels is not None and (
        not isinstance(labels, list) or len(labels) != len(row["questions"])
    ):
        return "field 'labels' must be a list with one gold value (or null) per question"
    try:
        decision = decide(model, row["input"], row["questions"], min_mass=min_mass)
    except (DecisionError, ScoringError) as exc:
        return str(exc)
    answers = [hook(a) if hook else a for a in decision.answers]
    return {
        **row,
        "input_line": line,
        "model": decision.model,
        "answers": [a.to_dict() for a in answers],
    }


def decide_chunk(
    model: Model,
    chunk: list[Row],
    start: int = 0,
    *,
    min_mass: float = 0.0,
    hook: AnswerHook | None = None,
) -> ChunkResult:
    """Decide one chunk of ``(line, row, error)`` rows; rows up to line ``start`` are skipped.

    Each row is one :func:`~gnll.scoring.decisions.decide` call: the options of all its questions
    are scored together, so the input they share runs once.
    """
    res = ChunkResult(rows=[], errors=[])
    for line, row, err in chunk:
        res.rows_in += 1
        if line <= start:
            res.skipped_resume += 1
            continue
        out = (
            err if err is not None or row is None else _decide_row(model, line, row, min_mass, hook)
        )
        if isinstance(out, dict):
            res.rows.append(out)
        else:
            res.errors.append((line, out or "unreadable row", row))
    return res


def run_decide_job(
    model: Model,
    job: ScoreJob,
    *,
    min_mass: float = 0.0,
    hook: AnswerHook | None = None,
) -> ScoreSummary:
    """Decide every row of ``job.input`` into ``job.output`` (see the module docstring).

    ``job`` is a :class:`~gnll.scoring.stream.ScoreJob` for its files and their rules (``input``,
    ``output``, formats, ``errors``, ``resume``, ``overwrite``, ``chunk_size``, ``progress``).
    """
    if model.capabilities.missing(["scoring"]):
        raise ScoringError(
            f"{model.name} cannot teacher-force (no prompt log-probs), so it cannot give an "
            "option's exact probability; use the in-process backend or a vLLM server"
        )

    def map_chunks(todo: Iterator[tuple[list[Row], int]]) -> Iterator[ChunkResult]:
        return (
            decide_chunk(model, chunk, first, min_mass=min_mass, hook=hook) for chunk, first in todo
        )

    return run_score_job(None, job, map_chunks=map_chunks, desc="deciding", required=DECIDE_COLUMNS)
