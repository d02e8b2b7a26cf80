"""The ``gnll score`` loop: read a chunk of rows, score the valid ones, write, repeat.

Memory holds one chunk (``chunk_size`` rows) at a time. A chunk the backend rejects as a whole is
scored row by row, so one bad row (e.g. longer than the model's context) is reported with its line and
the others are still scored.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from gnll import measures as M
from gnll._util.validation import ParameterError
from gnll.backends.base import GenerationConfig, Model, ScoredAnswer
from gnll.backends.prompting import DEFAULT_MAX_NEW_TOKENS
from gnll.calibration.fitting import calibration_applies
from gnll.scoring.api import ScoringError, score
from gnll.scoring.output import ErrorLog, RowWriter, check_output, resume_point
from gnll.scoring.resume import check_same_input
from gnll.scoring.rows import (
    SCORE_COLUMNS,
    Item,
    Row,
    check_columns,
    count_rows,
    iter_rows,
    to_item,
)
from gnll.spans import SPAN_KINDS
from gnll.uncertainty import span_columns

logger = logging.getLogger(__name__)

__all__ = [
    "CALIBRATED_COLUMNS",
    "ChunkResult",
    "ScoreJob",
    "ScoreSummary",
    "build_score_job",
    "run_score_job",
    "score_calibration",
    "score_chunk",
]

#: What a row's scoring may raise that concerns that row only (over-long, untokenisable, ...).
ERRORS = (ScoringError, ValueError, RuntimeError, IndexError, TypeError)

#: Which output column a calibration's measure is applied to.
CALIBRATED_COLUMNS = {"g-nll": "nll", "nll": "nll", "ln-g-nll": "ln_nll", "ln_nll": "ln_nll"}


@dataclass
class ScoreJob:
    """What ``gnll score`` was asked to do, checked on construction (the CLI maps its options onto
    this through :func:`build_score_job`, and hands the same job to either engine).

    Raises :class:`~gnll._util.validation.ParameterError` (a ``ValueError`` naming the parameter)
    for a value no engine can run.

    >>> ScoreJob("in.jsonl", "out.jsonl", "jsonl", "jsonl", None, long=True).max_new_tokens
    100
    >>> ScoreJob("in.jsonl", "out.jsonl", "jsonl", "jsonl", None, spans="words")
    Traceback (most recent call last):
    ...
    gnll._util.validation.ParameterError: spans must be sentence or json, got 'words'
    """

    input: str
    output: str
    input_format: str
    output_format: str
    errors: Path | None
    #: ``question`` rows get the long-answer instruction (``gnll ask --long``).
    long: bool = False
    #: Added by :meth:`for_model` where the model is loaded (a chat model's template).
    render_messages: Callable[[list[dict[str, Any]]], str] | None = None
    raw_prompt: bool = False
    verbatim: bool = False
    logprobs: bool = False
    with_greedy: bool = False
    spans: str | None = None  # "sentence" or "json": add each answer's span NLLs (gnll.spans)
    #: Cap of ``with_greedy`` answers; ``None``: :data:`~gnll.backends.prompting.DEFAULT_MAX_NEW_TOKENS` (100 with ``long``).
    max_new_tokens: int | None = None
    calibrator: Any = None
    resume: bool = False
    #: Replace an earlier run's output and errors file (without it, or ``resume``, one is refused).
    overwrite: bool = False
    chunk_size: int = 256
    batch_size: int | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ParameterError("chunk_size", f"must be >= 1, got {self.chunk_size}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ParameterError("batch_size", f"must be >= 1, got {self.batch_size}")
        if self.spans is not None and self.spans not in SPAN_KINDS:
            raise ParameterError("spans", f"must be sentence or json, got {self.spans!r}")
        if self.max_new_tokens is None:
            self.max_new_tokens = DEFAULT_MAX_NEW_TOKENS[self.long]
        elif self.max_new_tokens < 1:
            raise ParameterError("max_new_tokens", f"must be >= 1, got {self.max_new_tokens}")
        if self.resume and self.output == "-":
            raise ParameterError("resume", "needs an output file, not stdout")
        if self.output_format not in ("jsonl", "csv"):
            raise ParameterError(
                "output_format",
                f"must be jsonl or csv, got {self.output_format!r} (Parquet output is not "
                "supported)",
            )

    def for_model(self, model: Model) -> ScoreJob:
        """This job as ``model`` runs it: refused if the backend cannot teacher-force; a chat
        model renders ``messages`` rows with its template (run where the model is loaded)."""
        if model.capabilities.missing(["scoring"]):
            raise ValueError(
                f"{model.name} cannot score given answers: its backend cannot teacher-force"
            )
        if self.calibrator is not None:
            from gnll.calibration import scored_mismatch

            # a reasoning model's answers are scored after the marker: another G-NLL
            why = scored_mismatch(self.calibrator, "answer" if is_reasoning(model) else "output")
            if why is not None:
                raise ValueError(why)
        render = self.render_messages or (model.render_chat if model.capabilities.chat else None)
        return dataclasses.replace(self, render_messages=render)


def score_calibration(calibration: Any, *, model: str | None = None) -> Any:
    """The calibrator ``gnll score`` applies: ``calibration`` (a path, ``"auto"`` or a loaded
    :class:`~gnll.calibration.Calibrator`) loaded and checked to map a measure it can apply.

    Warns (:class:`~gnll.calibration.CalibrationMismatchWarning`) when it was fitted on
    another ``model``.
    """
    if calibration is None:
        return None
    cal = calibration
    if isinstance(cal, str | Path):
        from gnll.calibration import load_calibration

        cal = load_calibration(cal, model=model)
    measure = cal.meta.get("measure", "g-nll")
    if measure not in CALIBRATED_COLUMNS:
        where = calibration if isinstance(calibration, str | Path) else "the calibration"
        raise ValueError(
            f"{where} maps measure {measure!r}; gnll score can apply calibrations of "
            f"{', '.join(CALIBRATED_COLUMNS)}"
        )
    return cal


def build_score_job(
    *, model: str | None = None, calibration: Any = None, **fields: Any
) -> ScoreJob:
    """The one way a command builds its :class:`ScoreJob`, before choosing an engine.

    ``calibration`` is loaded and checked here (:func:`score_calibration`, against the ``model``
    name); every other keyword is a :class:`ScoreJob` field. The job does not depend on the
    loaded model: each engine applies :meth:`ScoreJob.for_model` where the model is.
    """
    return ScoreJob(calibrator=score_calibration(calibration, model=model), **fields)


@dataclass
class ScoreSummary:
    rows_in: int = 0
    scored: int = 0
    failed: int = 0
    skipped_resume: int = 0
    boundary_merged: int = 0
    #: Rows left without ``p_correct`` per prompt format: not the calibration's format.
    uncalibrated: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    errors_path: str | None = None
    notes: list[str] = field(default_factory=list)


def _chunks(it: Iterator, n: int) -> Iterator[list]:
    while chunk := list(islice(it, n)):
        yield chunk


def _score_items(
    model: Model, items: list[Item], batch_size: int | None, verbatim: bool
) -> list[ScoredAnswer | str]:
    """Score items (raw and rendered prompts in separate calls); per-row fallback on failure."""
    out: list[ScoredAnswer | str] = [""] * len(items)
    for raw in (False, True):
        idx = [i for i, it in enumerate(items) if it.raw_prompt == raw]
        if not idx:
            continue
        prompts = [items[i].prompt for i in idx]
        answers = [items[i].answer for i in idx]
        traces = [items[i].trace for i in idx]
        kw = {"raw_prompt": raw, "verbatim": verbatim}
        if any(t is not None for t in traces):
            kw["traces"] = traces
        try:
            res: list[ScoredAnswer | str] = list(
                score(model, prompts, answers, batch_size=batch_size, **kw)
            )
        except ERRORS as e:
            if len(idx) == 1:
                res = [_message(e)]
            else:
                res = []
                for p, a, t in zip(prompts, answers, traces, strict=True):
                    one = {**kw, "traces": [t]} if "traces" in kw else kw
                    try:
                        res.append(score(model, [p], [a], batch_size=1, **one)[0])
                    except ERRORS as e1:
                        res.append(_message(e1))
        for i, r in zip(idx, res, strict=True):
            out[i] = r
    return out


def is_reasoning(model: Model) -> bool:
    """A model that reasons before it answers (``--model_args reasoning=think``)."""
    return model.capabilities.reasoning is not None


def _message(e: Exception) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"cannot score: {text}"


def _greedy(model: Model, items: list[Item], max_new_tokens: int) -> list[Any]:
    """The model's own greedy answer per row (for ``g_nll``); raw prompts cannot be re-rendered."""
    todo = [i for i, it in enumerate(items) if not it.raw_prompt]
    out: list[Any] = [None] * len(items)
    if todo:
        gens = model.generate(
            [items[i].prompt for i in todo], GenerationConfig.greedy(max_new_tokens=max_new_tokens)
        )
        for i, [g] in zip(todo, gens, strict=True):
            out[i] = g
    return out


def _output_row(
    item: Item, s: ScoredAnswer, job: ScoreJob, greedy: Any, reasoning: bool = False
) -> dict[str, Any]:
    row = dict(item.row)
    row.update(
        input_line=item.line,
        prompt_format=item.prompt_format,
        nll=s.nll,
        ln_nll=s.ln_nll,
        num_tokens=s.num_tokens,
        is_greedy=s.is_greedy,
        greedy_stops=s.greedy_stops,
        boundary_merged=s.boundary_merged,
    )
    if reasoning:  # a reasoning model: the trace (given, or its own greedy one) is context
        row["scored"] = "answer"
    if job.logprobs:
        row["tokens"] = list(s.tokens)
        row["token_logprobs"] = [float(x) for x in s.token_logprobs]
    if job.spans:
        row.update(span_columns(s.tokens, s.token_logprobs, s.text, job.spans))  # type: ignore[arg-type]
    if item.tool_names is not None:  # a tool-call answer: each call's and argument's NLL
        from gnll.toolcalls import call_report, parse_output

        parsed = parse_output(s.text, item.tool_names)
        row["tool_calls"] = call_report(s.tokens, list(s.token_logprobs), s.text, parsed.calls)
    if job.with_greedy:
        row["greedy_answer"] = None if greedy is None else greedy.text
        # the greedy answer's measured log-probs: an empty answer counts its stop token's
        row["g_nll"] = None if greedy is None else M.g_nll(greedy)
    if job.calibrator is not None and not calibration_applies(job.calibrator, item.prompt_format):
        row["p_correct"] = row["abstain"] = None  # fitted on another prompt format
    elif job.calibrator is not None:
        col = CALIBRATED_COLUMNS[job.calibrator.meta.get("measure", "g-nll")]
        row["p_correct"] = float(job.calibrator.predict_proba([row[col]])[0])
        row["abstain"] = bool(job.calibrator.abstain([row[col]])[0])
    return row


@dataclass
class ChunkResult:
    """What one chunk of input rows became: errors (in the order the local loop writes them: unreadable
    and invalid rows as met, then rows the model could not score) and output rows."""

    rows: list[dict[str, Any]]
    errors: list[tuple[int, str, dict[str, Any] | None]]
    rows_in: int = 0
    skipped_resume: int = 0
    boundary_merged: int = 0
    uncalibrated: dict[str, int] = field(default_factory=dict)


def score_chunk(model: Model, job: ScoreJob, chunk: list[Row], start: int = 0) -> ChunkResult:
    """Score one chunk of ``(line, row, error)`` input rows; rows up to line ``start`` are skipped."""
    res = ChunkResult(rows=[], errors=[])
    items: list[Item] = []
    for line, row, err in chunk:
        res.rows_in += 1
        if line <= start:
            res.skipped_resume += 1
            continue
        if err is None:
            item = to_item(
                line,
                row,
                long=job.long,
                render_messages=job.render_messages,
                raw_prompt=job.raw_prompt,
            )
            if isinstance(item, Item):
                items.append(item)
                continue
            err = item
        res.errors.append((line, err, row))
    scored = _score_items(model, items, job.batch_size, job.verbatim) if items else []
    greedy = _greedy(model, items, job.max_new_tokens) if job.with_greedy and items else []
    for k, (item, s) in enumerate(zip(items, scored, strict=True)):
        if isinstance(s, str):
            res.errors.append((item.line, s, item.row))
            continue
        res.boundary_merged += bool(s.boundary_merged)
        if job.calibrator is not None and not calibration_applies(
            job.calibrator, item.prompt_format
        ):
            fmt = item.prompt_format
            res.uncalibrated[fmt] = res.uncalibrated.get(fmt, 0) + 1
        res.rows.append(
            _output_row(item, s, job, greedy[k] if greedy else None, is_reasoning(model))
        )
    return res


#: Turns the chunks of a job into their results, in order (the local engine: one after another).
ChunkMapper = Callable[[Iterator[tuple[list[Row], int]]], Iterator[ChunkResult]]


def run_score_job(
    model: Model | None,
    job: ScoreJob,
    *,
    map_chunks: ChunkMapper | None = None,
    desc: str = "scoring",
    required: tuple[tuple[str, ...], ...] = SCORE_COLUMNS,
) -> ScoreSummary:
    """Score every row of ``job.input`` into ``job.output``; bad rows go to the errors log.

    ``map_chunks`` computes the chunks elsewhere (``gnll.distributed``: on Ray replicas, each
    scoring with ``job.for_model(its model)``); it gets ``(chunk, resume line)`` pairs and must
    yield their :class:`ChunkResult` in the same order.
    ``desc`` labels the progress bar; ``required`` lists the columns (groups of alternatives) every
    row needs, checked once against a CSV or Parquet header. An output that would destroy data (the input itself, an
    earlier run without ``job.resume`` or ``job.overwrite``) raises
    :class:`~gnll.scoring.output.OutputExistsError` before anything is read or written.
    """
    check_output(
        job.input,
        job.output,
        job.errors,
        job.output_format,
        resume=job.resume,
        overwrite=job.overwrite,
    )
    check_columns(job.input, job.input_format, required)
    t0 = time.perf_counter()
    summary = ScoreSummary(errors_path=str(job.errors) if job.errors else None)
    start = 0
    if job.resume and job.output != "-":
        fields = [name for group in required for name in group]
        check_same_input(Path(job.output), job.output_format, job.input, job.input_format, fields)
        start = resume_point(Path(job.output), job.output_format, job.errors)
        if start:
            logger.info("%s: resuming after input line %d", job.output, start)
    append = job.resume and job.output != "-" and Path(job.output).exists()
    writer = RowWriter(job.output, job.output_format, append=append)
    errors = ErrorLog(job.errors, append=append)
    total = count_rows(job.input, job.input_format) if job.progress else None
    from tqdm.auto import tqdm

    if map_chunks is None:
        assert model is not None
        job = job.for_model(model)

        def map_chunks(todo: Iterator[tuple[list[Row], int]]) -> Iterator[ChunkResult]:
            return (score_chunk(model, job, chunk, first) for chunk, first in todo)

    chunks = ((c, start) for c in _chunks(iter_rows(job.input, job.input_format), job.chunk_size))
    bar = tqdm(total=total, unit="rows", disable=not job.progress, desc=desc, smoothing=0.1)
    try:
        for res in map_chunks(chunks):
            summary.rows_in += res.rows_in
            summary.skipped_resume += res.skipped_resume
            summary.boundary_merged += res.boundary_merged
            for fmt, n in res.uncalibrated.items():
                summary.uncalibrated[fmt] = summary.uncalibrated.get(fmt, 0) + n
            for line, err, row in res.errors:
                errors.write(line, err, row)
            # Errors first: a row past the last output row is re-scored on resume, never lost.
            errors.flush()
            writer.write(res.rows)
            summary.scored += len(res.rows)
            bar.update(res.rows_in)
    finally:
        bar.close()
        writer.close()
        errors.close()
    summary.failed = errors.count
    if job.errors is not None and append and job.errors.exists():
        with job.errors.open("rb") as fh:  # rows that failed before the resume count too
            summary.failed = sum(1 for _ in fh)
    summary.seconds = time.perf_counter() - t0
    return summary
