"""``gnll generate``: answer a file of questions, with G-NLL (and P(correct)) for every answer.

Each row is answered by :func:`gnll.ask` (the same prompt, answer and G-NLL as ``gnll ask`` gives
for that question), and the rows stream through the machinery of ``gnll score``
(:func:`~gnll.scoring.stream.run_score_job`): the same input formats, errors file by line,
flush per chunk and ``--resume``. Under ``--policy refuse`` the greedy answers can stop at their
exact early decision (:func:`early_greedy`: the decoding loop ``gnll serve`` runs, in the calling
thread).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gnll.backends.base import ContextOverflow, Model
from gnll.backends.decoding import DecodingLoop, EarlyGreedy
from gnll.measures.early import EarlyDecisionError
from gnll.policy import AbstentionPolicy
from gnll.scoring.asking import ask, reasoning_columns
from gnll.scoring.rows import Row
from gnll.scoring.stream import ERRORS, ChunkResult, ScoreJob, ScoreSummary, run_score_job

if TYPE_CHECKING:
    from gnll.semantic import Clusterer

__all__ = ["AskOptions", "answer_chunk", "early_greedy", "run_generate_job"]


@dataclass
class AskOptions:
    """What :func:`gnll.ask` is called with for every row (see its parameters)."""

    measures: Sequence[str] = ("g-nll",)
    long: bool = False
    samples: int = 10
    temperature: float = 1.0
    beams: int = 5
    clusterer: str | Clusterer = "auto"
    clusterer_args: Mapping[str, Any] = field(default_factory=dict)
    max_new_tokens: int | None = None
    seed: int = 0
    calibration: Any = None
    logprobs: bool = False
    #: How each question is sent (:mod:`gnll.backends.prompting`), as ``gnll ask --prompt_format``.
    prompt_format: str = "instruction"
    #: A refuse policy (``gnll generate --policy refuse``): the :class:`gnll.policy.AbstentionPolicy`
    #: of ``gnll serve --policy refuse``, so the decisions and the refusal text are the server's;
    #: ``None``: every answer is written.
    policy: AbstentionPolicy | None = None


def _question(row: dict[str, Any]) -> str | None:
    """The row's question, or ``None`` with the reason in :func:`_question_error`."""
    q = row.get("question")
    return q if isinstance(q, str) and q.strip() else None


def _question_error(row: dict[str, Any]) -> str:
    q = row.get("question")
    if q is None:
        return "missing field 'question'"
    if not isinstance(q, str):
        return f"field 'question' must be a string, got {type(q).__name__}"
    return "field 'question' is empty"


def _output_row(
    line: int, row: dict[str, Any], result: Any, opts: AskOptions, model_name: str
) -> dict[str, Any]:
    out = dict(row)
    out["input_line"] = line
    out["answer"] = result.answer
    # which model answered, and under which prompt format: gnll calibrate records both
    out["model"] = model_name
    out["prompt_format"] = result.prompt_format
    out.update({name.replace("-", "_"): value for name, value in result.measures.items()})
    out["num_tokens"] = len(result.greedy.tokens)
    out["finish_reason"] = result.greedy.finish_reason
    out.update(result.calibrated())
    out.update(reasoning_columns(result.greedy))
    if opts.logprobs:
        out["tokens"] = list(result.greedy.tokens)
        out["token_logprobs"] = [float(x) for x in result.greedy.token_logprobs]
    if opts.policy is not None:
        _apply_refusal(out, result, opts.policy, opts)
    return out


#: Columns that carry a refused answer's text or tokens: withheld, as ``gnll serve`` withholds them.
_WITHHELD = ("tokens", "token_logprobs", "trace")


def _apply_refusal(
    out: dict[str, Any], result: Any, policy: AbstentionPolicy, opts: AskOptions
) -> None:
    """Under a refuse policy: ``refused`` on every row; a refused row's answer text, tokens and
    trace are replaced by the refusal (its ``g_nll``, the value it was decided on, stays)."""
    scored = "answer" if result.greedy.reasoning is not None else "output"
    refused = bool(policy.decide(result.measures["g-nll"], result.prompt_format, scored)[1])
    out["refused"] = refused
    early = result.greedy.early
    if early is not None:  # stopped at the decision token: the rest was never generated
        out.update(early.record())
    if refused:
        out["answer"] = policy.refusal
        for name in _WITHHELD:
            out.pop(name, None)


def answer_chunk(model: Model, opts: AskOptions, chunk: list[Row], start: int = 0) -> ChunkResult:
    """Answer one chunk of ``(line, row, error)`` input rows; rows up to line ``start`` are skipped."""
    res = ChunkResult(rows=[], errors=[])
    for line, row, err in chunk:
        res.rows_in += 1
        if line <= start:
            res.skipped_resume += 1
            continue
        if err is None and row is not None and _question(row) is None:
            err = _question_error(row)
        if err is not None or row is None:
            res.errors.append((line, err or "unreadable row", row))
            continue
        try:
            result = ask(
                model,
                row["question"],
                opts.measures,
                long=opts.long,
                samples=opts.samples,
                temperature=opts.temperature,
                beams=opts.beams,
                clusterer=opts.clusterer,
                clusterer_args=opts.clusterer_args,
                max_new_tokens=opts.max_new_tokens,
                seed=opts.seed,
                calibration=opts.calibration,
                prompt_format=opts.prompt_format,
            )
        except ERRORS as exc:
            if isinstance(exc, ContextOverflow):  # this row's question, not "prompt 0"
                text = exc.for_question()
            else:
                text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            res.errors.append((line, f"cannot answer: {text}", row))
            continue
        res.rows.append(_output_row(line, row, result, opts, model.name))
    return res


def run_generate_job(model: Model, job: ScoreJob, opts: AskOptions) -> ScoreSummary:
    """Answer every row of ``job.input`` into ``job.output`` (``job`` supplies files, formats,
    errors file, ``resume``, ``chunk_size`` and ``progress``; its scoring fields are unused)."""

    def map_chunks(todo: Iterator[tuple[list[Row], int]]) -> Iterator[ChunkResult]:
        return (answer_chunk(model, opts, chunk, first) for chunk, first in todo)

    return run_score_job(
        None, job, map_chunks=map_chunks, desc="generating", required=(("question",),)
    )


def early_greedy(
    model: Model, policy: AbstentionPolicy, *, measures: Sequence[str], prompt_format: str
) -> EarlyGreedy:
    """``model`` with greedy answers that stop where ``policy`` refuses them whatever follows
    (:class:`gnll.backends.decoding.EarlyGreedy`). A reasoning model's trace runs to its end; its
    answer, after the end-of-reasoning marker, stops at the decision.

    Raises
    ------
    EarlyDecisionError
        Why no answer can be stopped early: the policy decides only at the end (its own message,
        naming its parameters), a measure other than G-NLL needs the whole answer, or the model
        (a reasoning model: the model it wraps) has no decoding loop to stop.
    """
    policy.early_decision(prompt_format=prompt_format)  # raises for a policy that cannot
    if list(measures) != ["g-nll"]:
        raise EarlyDecisionError(
            "the other measures need the whole answer (give measures g-nll)", param="measures"
        )
    loop = DecodingLoop(model)
    if not loop.decides_early:
        what = (
            f"{model.name} (the model it reasons with)"
            if model.capabilities.reasoning
            else model.name
        )
        raise EarlyDecisionError(f"{what} has no decoding loop to stop (the hf backend's)")
    return EarlyGreedy(loop, lambda: policy.early_decision(prompt_format=prompt_format))
