"""``gnll.ask``: answer one question and say how uncertain the model is, in one call.

The pipeline of ``gnll ask`` as a library function (uqlm's ``generate_and_score``): the greedy
answer, then only what the requested measures need (beams, samples, semantic clusters), then the
measures and, given a calibration, P(correct) and the abstention decision.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gnll import measures as M
from gnll._util.validation import ParameterError
from gnll.backends.base import Generation, GenerationConfig, Model
from gnll.backends.prompting import (
    DEFAULT_MAX_NEW_TOKENS,
    PromptFormat,
    check_format,
    instruction_prompt,
    prompt_for,
)
from gnll.spans import SPAN_KINDS, SpanKind
from gnll.uncertainty import span_columns

if TYPE_CHECKING:
    from gnll.calibration import Calibrator
    from gnll.semantic import Clusterer

__all__ = ["AskOptionError", "AskResult", "ask", "ask_calibration", "check_ask_options"]


class AskOptionError(ParameterError):
    """An option of :func:`ask` that cannot work; ``option`` names it, ``reason`` says why (a
    :class:`~gnll._util.validation.ParameterError`, as ``ScoreJob``'s)."""

    def __init__(self, option: str, reason: str) -> None:
        super().__init__(option, reason)
        self.option = option
        self.reason = reason


@dataclass
class AskResult:
    """One answered question and its uncertainty.

    Attributes
    ----------
    question, model, prompt
        The question, the model's name and the prompt sent (the user text, before any chat template).
    prompt_format
        How the question became the prompt (:mod:`gnll.backends.prompting`).
    greedy
        The greedy answer with its tokens and log-probs; ``answer`` is its text.
    measures
        Measure name -> value (higher = more uncertain), in the order asked for, G-NLL first.
    beams, samples, cluster_ids
        What the measures needed (``None`` when none needed it).
    p_correct, abstain
        From a calibration, if one was given (``abstain`` only if it has a threshold).
    spans
        With ``spans=``: the greedy answer's span fields, named as on every surface
        (:func:`gnll.uncertainty.span_columns`: ``spans``, ``spans_kind``, ``least_certain_span``,
        ``max_span_nll``, ``unassigned_nll``, or ``spans_error``).
    """

    question: str
    model: str
    prompt: str
    greedy: Generation
    measures: dict[str, float]
    beams: list[Generation] | None = None
    samples: list[Generation] | None = None
    cluster_ids: list[int] | None = None
    p_correct: float | None = None
    abstain: bool | None = None
    prompt_format: str = "instruction"
    spans: dict[str, Any] | None = None

    @property
    def answer(self) -> str:
        """The greedy answer's text."""
        return self.greedy.text

    def calibrated(self) -> dict[str, object]:
        """``p_correct`` and ``abstain`` when they were computed (empty without a calibration)."""
        out: dict[str, object] = {}
        if self.p_correct is not None:
            out["p_correct"] = self.p_correct
        if self.abstain is not None:
            out["abstain"] = self.abstain
        return out

    def to_dict(self) -> dict[str, object]:
        """The JSON record ``gnll ask --json`` prints (measure names with ``_`` for ``-``)."""
        record: dict[str, object] = {
            "question": self.question,
            "model": self.model,
            "prompt_format": self.prompt_format,
            "answer": self.greedy.text,
            "tokens": self.greedy.tokens,
            "token_logprobs": self.greedy.token_logprobs,
            "finish_reason": self.greedy.finish_reason,
        }
        if not self.greedy.tokens:  # what its measures were computed from (the empty-answer rule)
            record["stop_token_logprob"] = self.greedy.measured_logprobs[0]
        record.update({name.replace("-", "_"): value for name, value in self.measures.items()})
        record.update(self.calibrated())
        if self.samples is not None:
            record["samples"] = [g.text for g in self.samples]
            record["sample_token_logprobs"] = [g.token_logprobs for g in self.samples]
        if self.beams is not None:
            record["beam_token_logprobs"] = [g.token_logprobs for g in self.beams]
        if self.cluster_ids is not None:
            record["cluster_ids"] = list(self.cluster_ids)
        if self.spans is not None:
            record.update(self.spans)
        record.update(reasoning_columns(self.greedy))
        return record


def reasoning_columns(gen: Generation) -> dict[str, object]:
    """What a reasoning model's answer adds to ``gnll ask --json`` and ``gnll generate`` rows:
    ``scored: "answer"`` (its measures are the answer's, given the trace), the ``trace`` and its
    ``trace_nll`` / ``trace_tokens``. Empty for a model that does not reason."""
    split = gen.reasoning
    if split is None:
        return {}
    r = split.record()
    return {
        "scored": "answer",
        "trace": split.trace_text,
        "trace_nll": r["trace_nll"],
        "trace_tokens": r["trace_tokens"],
    }


def check_ask_options(
    *,
    samples: int = 10,
    beams: int = 5,
    temperature: float = 1.0,
    max_new_tokens: int | None = None,
    spans: str | None = None,
) -> None:
    """Refuse options :func:`ask` cannot work with (raises :class:`AskOptionError`).

    Cheap, so callers can run it before loading a model.

    >>> check_ask_options(samples=0)
    Traceback (most recent call last):
    ...
    gnll.scoring.asking.AskOptionError: samples must be >= 1, got 0
    """
    if samples < 1:
        raise AskOptionError("samples", f"must be >= 1, got {samples}")
    if beams < 1:
        raise AskOptionError("beams", f"must be >= 1, got {beams}")
    if not (temperature > 0 and math.isfinite(temperature)):
        raise AskOptionError(
            "temperature",
            f"must be a positive number, got {temperature} (temperature 0 is greedy decoding, "
            "whose answer G-NLL already scores)",
        )
    if max_new_tokens is not None and max_new_tokens < 1:
        raise AskOptionError("max_new_tokens", f"must be >= 1, got {max_new_tokens}")
    if spans is not None and spans not in SPAN_KINDS:
        raise AskOptionError("spans", f"must be sentence or json, got {spans!r}")


def check_question(question: object) -> str:
    """The question, or ``ValueError`` when it is not text or is empty/whitespace: a model asked
    nothing still answers something, with a G-NLL that means nothing.

    >>> check_question("   ")
    Traceback (most recent call last):
    ...
    ValueError: the question is empty
    """
    if not isinstance(question, str):
        raise ValueError(f"the question must be text, got {type(question).__name__}")
    if not question.strip():
        raise ValueError("the question is empty")
    return question


#: The prompts ``gnll ask`` (and ``gnll serve --prompt-format instruction``) asks, in words.
ASK_PROMPTS = "questions asked as gnll ask asks them (zero-shot, short-answer instruction)"


def ask_calibration(
    spec: str,
    *,
    model: str,
    long: bool = False,
    measures: Iterable[str] | None = None,
    prompt_format: PromptFormat = "instruction",
) -> Calibrator:
    """Load the calibration for :func:`ask`: a ``gnll calibrate`` file, or ``"auto"`` (shipped).

    Warns (:class:`gnll.calibration.CalibrationMismatchWarning`) when the file was fitted on another
    model or prompt; raises ``FileNotFoundError``/``ValueError`` for a missing or unusable file,
    :class:`gnll.calibration.CalibrationFormatError` (a ``ValueError``) when it was fitted on
    another ``prompt_format``, and ``ValueError`` when the measure it maps is not among
    ``measures``.
    """
    from gnll.calibration import load_calibration, prompt_fingerprint

    fmt = check_format(prompt_format)
    cal = load_calibration(
        spec,
        model=model,
        prompt_fingerprint=(
            prompt_fingerprint(instruction_prompt("{question}", long=long))
            if fmt == "instruction"
            else None
        ),
        prompt_format=fmt,
        prompt_description=ASK_PROMPTS,
    )
    if measures is not None:
        _calibrated_measure(cal, measures)
    return cal


def _calibrated_measure(cal: Calibrator, measures: Iterable[str]) -> str:
    measure = str(cal.meta.get("measure", "g-nll"))
    if measure not in {"g-nll", *measures}:  # ask always computes G-NLL
        raise ValueError(f"the calibration maps {measure!r}; add it to the measures")
    return measure


def ask(
    model: Model | str,
    question: str,
    measures: Sequence[str] | str = ("g-nll",),
    *,
    long: bool = False,
    samples: int = 10,
    temperature: float = 1.0,
    beams: int = 5,
    clusterer: str | Clusterer = "auto",
    clusterer_args: Mapping[str, Any] | None = None,
    max_new_tokens: int | None = None,
    seed: int = 0,
    calibration: str | Calibrator | None = None,
    prompt_format: PromptFormat = "instruction",
    spans: SpanKind | None = None,
) -> AskResult:
    """Answer ``question`` greedily and compute the requested uncertainty measures.

    Parameters
    ----------
    model
        A loaded model, or a name for :func:`gnll.load_model` (loaded for this call only).
    question
        The question, sent in ``prompt_format`` (:mod:`gnll.backends.prompting`): by default
        ``"instruction"``, the evaluation's zero-shot prompt
        (:func:`gnll.backends.prompting.instruction_prompt`); ``"chat"``, the question alone as a
        chat message; ``"text"``, the question as the exact text.
    measures
        Measure names (or one comma-separated string) from :data:`gnll.measures.ORDER`; G-NLL is
        always computed.
    long
        Ask for a one-sentence answer instead of a brief one.
    samples, temperature, seed
        Sampled answers for the sampling-based measures (PE, SE, ...).
    beams
        Beam width for BS-MSP.
    clusterer, clusterer_args
        Semantic clusterer for SE, LN-SE, D-SE and MCP: a name for
        :func:`gnll.semantic.load_clusterer` (with its keyword arguments) or a clusterer object.
    max_new_tokens
        Answer length cap; default 50 (100 with ``long``).
    calibration
        A :class:`gnll.calibration.Calibrator`, a ``gnll calibrate`` file or ``"auto"``: adds
        ``p_correct`` and ``abstain``. One fitted on another prompt format is refused
        (:class:`gnll.calibration.CalibrationFormatError`).
    spans
        ``"sentence"`` or ``"json"``: also split the answer's G-NLL over its sentences or JSON field
        values (:mod:`gnll.spans`), in :attr:`AskResult.spans`.

    Returns
    -------
    AskResult
        The answer, its tokens and log-probs, the measures and what they were computed from.

    Examples
    --------
    >>> from gnll import ask, load_model
    >>> model = load_model("smollm2-135m-instruct", progress=False)  # doctest: +SKIP
    >>> result = ask(model, "What is the capital of France?", measures=["g-nll", "pe"])  # doctest: +SKIP
    >>> result.answer, round(result.measures["g-nll"], 3)  # doctest: +SKIP
    ('Paris', 0.012)
    """
    check_question(question)
    wanted = M.validate(measures)
    if "g-nll" not in wanted:
        wanted.insert(0, "g-nll")
    check_ask_options(
        samples=samples,
        beams=beams,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        spans=spans,
    )
    if isinstance(model, str):
        from gnll.backends import load_model

        model = load_model(model, progress=False)
    fmt = check_format(prompt_format)
    if isinstance(calibration, str):
        calibration = ask_calibration(calibration, model=model.name, long=long, prompt_format=fmt)
    elif calibration is not None:
        calibration.check(prompt_format=fmt)
    if calibration is not None:  # a reasoning model's G-NLL is its answer's: another number
        from gnll.policy import scored_of

        calibration.check(scored=scored_of(model))
    calibrated = None if calibration is None else _calibrated_measure(calibration, wanted)
    prompt, raw = prompt_for(question, fmt, long=long)
    how = {"raw_prompt": True} if raw else {}  # models that render every prompt verbatim
    cap = max_new_tokens if max_new_tokens is not None else DEFAULT_MAX_NEW_TOKENS[long]
    [[greedy]] = model.generate([prompt], GenerationConfig.greedy(max_new_tokens=cap), **how)

    needs = M.requirements(wanted)
    beam_gens = sample_gens = cluster_ids = None
    if M.Needs.BEAMS in needs:
        beam = GenerationConfig.beam(beams, max_new_tokens=cap)
        [beam_gens] = model.generate([prompt], beam, **how)
    if M.Needs.SAMPLES in needs:
        cfg = GenerationConfig.sample(
            samples, temperature=temperature, max_new_tokens=cap, seed=seed
        )
        [sample_gens] = model.generate([prompt], cfg, **how)
    if M.Needs.CLUSTERS in needs:
        if isinstance(clusterer, str):
            from gnll.semantic import load_clusterer

            clusterer = load_clusterer(clusterer, **dict(clusterer_args or {}))
        cluster_ids = list(clusterer.cluster(question, [g.text for g in sample_gens or []]))
    values = M.compute(wanted, greedy, beam_gens, sample_gens, cluster_ids)
    result = AskResult(
        question=question,
        model=model.name,
        prompt=prompt,
        greedy=greedy,
        measures=values,
        beams=beam_gens,
        samples=sample_gens,
        cluster_ids=cluster_ids,
        prompt_format=fmt,
        spans=(
            None
            if spans is None
            else span_columns(greedy.tokens, greedy.token_logprobs, greedy.text, spans)
        ),
    )
    if calibration is not None and calibrated is not None:
        result.p_correct = float(calibration.predict_proba([values[calibrated]])[0])
        if calibration.thresholds_:
            result.abstain = bool(calibration.abstain([values[calibrated]])[0])
    return result
