"""What a policy decides on and what it gives back: an :class:`Answer`, its ``uncertainty`` record
(:func:`uncertainty_record`), the caller's view of it (:class:`Decided`, :func:`apply_policy`), its
spans, its headers, and the escalation fields of a cascade's records (:func:`kept`,
:func:`escalated`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from gnll.backends.early import EarlyDecided
from gnll.backends.reasoning import ReasoningSplit
from gnll.measures import g_nll as _g_nll
from gnll.measures import ln_g_nll as _ln_g_nll
from gnll.measures.logprobs import LogprobError, check_logprobs
from gnll.spans import SpanReport, span_nlls
from gnll.uncertainty import LocalAnswer, Uncertainty

if TYPE_CHECKING:
    from gnll.policy.abstention import AbstentionPolicy

__all__ = [
    "Answer",
    "annotate",
    "scored_of",
    "Decided",
    "add_early",
    "answer_spans",
    "apply_policy",
    "escalated",
    "headers_for",
    "kept",
    "reasoning_fields",
    "uncertainty_record",
]


@dataclass
class Answer:
    """One choice: the answer text and the evidence its uncertainty is computed from."""

    text: str
    finish_reason: str | None
    tokens: list[str]
    token_logprobs: list[float]
    decoding: Literal["greedy", "sampled"] = "greedy"
    top_logprobs: list[dict[str, float]] | None = None
    completion_tokens: int | None = None
    #: What G-NLL is computed from (``Generation.measured_logprobs``): ``token_logprobs``, or for an
    #: empty answer its stop token's log-prob. ``None``: ``token_logprobs``.
    measured_logprobs: list[float] | None = None
    #: A reasoning model's trace/marker/answer split (:class:`gnll.backends.reasoning.ReasoningSplit`);
    #: the fields above are the answer's.
    reasoning: ReasoningSplit | None = None
    #: Set when the answer was stopped at an exact early decision: its tokens are those released
    #: by then, and its G-NLL a lower bound of the whole answer's.
    early: EarlyDecided | None = None


@dataclass(frozen=True)
class Decided:
    """One answer under a policy: its record, and the text and finish reason the caller sees (the
    policy's refusal when ``refuse`` abstained)."""

    uncertainty: Uncertainty
    text: str
    finish_reason: str | None

    @property
    def refused(self) -> bool:
        return bool(self.uncertainty.refused)


def uncertainty_record(
    token_logprobs: Sequence[float] | np.ndarray,
    *,
    decoding: Literal["greedy", "sampled"],
    policy: AbstentionPolicy,
    tokens: Sequence[str] | None = None,
    top_logprobs: Sequence[dict[str, float]] | None = None,
    include_tokens: bool = False,
    source: str = "model",
    measured_logprobs: Sequence[float] | np.ndarray | None = None,
    prompt_format: str | None = None,
    reasoning: ReasoningSplit | None = None,
) -> Uncertainty:
    """The ``uncertainty`` record of one answer (see the module docstring for the fields).

    ``reasoning``: a reasoning model's :class:`~gnll.backends.reasoning.ReasoningSplit` (the
    answer's log-probs are the answer's only; the record then says so, :func:`reasoning_fields`).

    ``prompt_format``: how the request's prompt was rendered (:mod:`gnll.backends.prompting`).

    ``measured_logprobs`` (``Generation.measured_logprobs``) is what G-NLL is computed from when it
    differs from the answer's ``token_logprobs``: for an empty answer, its stop token's log-prob.
    An answer with no log-prob at all has no G-NLL: a :class:`LogprobError`, never "0, certain".
    Log-probs are checked once (:class:`~gnll.measures.logprobs.ValidLogprobs`: checked ones are
    taken as they are, and measured log-probs equal to the answer's are not checked again).
    """
    answer_lps = check_logprobs(token_logprobs, where=source, tokens=tokens)
    same = measured_logprobs is None or measured_logprobs is token_logprobs
    if not same and len(measured_logprobs or ()) == len(answer_lps):
        same = list(measured_logprobs or ()) == list(token_logprobs)  # a non-empty answer's
    lps = answer_lps if same else check_logprobs(measured_logprobs or [], where=source)
    if not lps.size:
        raise LogprobError(
            f"{source} gave an empty answer without the log-prob of the token that ended it: "
            "its G-NLL is undefined (an empty answer is scored by its stop token's log-prob)"
        )
    nll, ln = _g_nll(lps), _ln_g_nll(lps)
    greedy = decoding == "greedy"
    scored = "answer" if reasoning is not None else "output"
    p_correct, abstain = policy.decide(nll, prompt_format, scored) if greedy else (None, None)
    return Uncertainty(
        decoding=decoding,
        g_nll=nll if greedy else None,
        ln_g_nll=ln if greedy else None,
        nll=nll,
        num_tokens=len(answer_lps),
        p_correct=p_correct,
        abstain=abstain,
        prompt_format=prompt_format,
        tokens=list(tokens) if include_tokens and tokens is not None else None,
        token_logprobs=answer_lps.tolist() if include_tokens else None,
        top_logprobs=(
            [dict(t) for t in top_logprobs] if include_tokens and top_logprobs is not None else None
        ),
        # a reasoning model: G-NLL is the answer's, given prompt + trace
        **(reasoning_fields(reasoning) if reasoning is not None else {}),
    )


def reasoning_fields(split: ReasoningSplit) -> dict[str, Any]:
    """The fields a reasoning model's answer adds to its record (:class:`ReasoningSplit`).

    ``scored``: which tokens G-NLL sums (``"answer"``: the answer after the end-of-reasoning
    marker, conditioned on prompt + trace); ``trace_nll`` / ``trace_tokens``: the trace's (a
    trace measure, not the answer's uncertainty); ``answer_tokens``: the tokens after the marker
    (the terminator included); ``split_at``: the first answer token's index among all generated
    tokens; ``trace_confidence``: DeepConf's confidences of the trace (lowest group, tail,
    bottom 10%: :mod:`gnll.measures.trace`), which rank traces for voting and say nothing on
    the answer's correctness by themselves.
    """
    r = split.record()
    return {
        "scored": "answer",
        "trace_nll": r["trace_nll"],
        "trace_tokens": r["trace_tokens"],
        "marker_tokens": r["marker_tokens"],
        "answer_tokens": r["answer_tokens"],
        "split_at": r["split_at"],
        "reasoning_format": r["format"],
        "reasoning_source": r["source"],
        "trace_confidence": split.trace_confidence(),
        **({"notes": r["notes"]} if r.get("notes") else {}),
    }


def headers_for(records: Sequence[Uncertainty]) -> dict[str, str]:
    """``X-Uncertainty-*`` response headers: one comma-separated value per choice."""

    def fmt(v: object) -> str:
        if v is None:
            return "none"  # one choice among several without the value
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return f"{v:.6g}"
        return str(v)

    fields = {
        "G-NLL": "g_nll",
        "LN-G-NLL": "ln_g_nll",
        "NLL": "nll",
        "Tokens": "num_tokens",
        "Decoding": "decoding",
        "P-Correct": "p_correct",
        "Abstain": "abstain",
    }
    # A header none of the choices has a value for (P-Correct without a calibration) is left out.
    headers = {
        f"X-Uncertainty-{h}": ",".join(fmt(getattr(r, k)) for r in records)
        for h, k in fields.items()
        if any(getattr(r, k) is not None for r in records)
    }
    if any(r.answered_by is not None for r in records):  # --policy escalate
        headers["X-Answered-By"] = ",".join(fmt(r.answered_by) for r in records)
    return headers


def apply_policy(
    policy: AbstentionPolicy, text: str, finish_reason: str | None, record: Uncertainty
) -> tuple[str, str | None, Uncertainty]:
    """The answer text, finish reason and record a client sees under ``policy`` for one choice.

    ``finish_reason`` stays within OpenAI's values (``"length"`` still says the answer was cut);
    abstention is ``record.abstain``. A refused answer's record has ``refused`` set and no tokens or
    log-probs, so nothing the client receives reveals it.
    """
    if not record.abstain or policy.mode != "refuse":
        return text, finish_reason, record
    refused = record.model_copy(
        update={"refused": True, "tokens": None, "token_logprobs": None, "top_logprobs": None}
    )
    return policy.refusal, finish_reason, refused


def answer_spans(
    text: str, tokens: Sequence[str] | None, logprobs: Sequence[float] | np.ndarray
) -> SpanReport | None:
    """``uncertainty.spans``: the answer's JSON field spans if it holds JSON, else its sentences
    (``None`` without tokens that line up with the log-probs). Offsets are in characters of the
    answer's text as the model wrote it; a refused answer gets none (they would reveal its text)."""
    if not tokens or len(tokens) != len(logprobs):
        return None
    lps = check_logprobs(logprobs, where="answer", tokens=tokens)  # as it is when checked already
    try:
        return span_nlls(list(tokens), lps, text, "json")
    except ValueError:
        return span_nlls(list(tokens), lps, text, "sentence")


def kept(
    records: Sequence[Uncertainty], answered_by: str, error: str | None = None
) -> list[Uncertainty]:
    """The records of answers an escalation policy kept (``error``: why the escalation failed,
    when it was tried and the local answers are sent instead)."""
    update: dict[str, Any] = {"answered_by": answered_by, "escalated": False}
    if error is not None:
        update["escalation_error"] = error
    return [r.model_copy(update=update) for r in records]


def escalated(
    records: Sequence[Uncertainty],
    *,
    answered_by: str | None,
    local: Uncertainty,
    local_text: str,
    local_model: str,
) -> list[Uncertainty]:
    """The records of the larger model's answers that replaced escalated local ones: each says
    who answered and carries the first local answer (its record and text) it replaced."""
    where = LocalAnswer.model_validate(local.to_json() | {"text": local_text, "model": local_model})
    update = {"answered_by": answered_by, "escalated": True, "local": where}
    return [r.model_copy(update=update) for r in records]


def add_early(record: Uncertainty, early: EarlyDecided) -> Uncertainty:
    """The record of an answer that stopped at an exact early decision (:mod:`gnll.measures.early`).

    Its ``g_nll``, ``p_correct`` and ``num_tokens`` are those of the answer tokens released when
    the decision was made (a lower bound of the whole answer's G-NLL, an upper bound of its
    ``p_correct``); the rest of the answer was never generated.
    """
    update = early.record() | {"withheld": "the rest of the answer: never generated"}
    return record.model_copy(update=update)


def scored_of(model: object) -> str:
    """Which tokens a model's G-NLL covers: ``"answer"`` (a reasoning model's answer after its
    end-of-reasoning marker, given the trace) or ``"output"`` (the whole output). A model (or a
    wrapper) declares it (``Model.scored``); an object that does not is ``"output"``."""
    declared = getattr(model, "scored", None)  # every Model declares it (Model.scored)
    return str(declared) if declared in ("answer", "output") else "output"


def annotate(
    answers: Sequence[Answer],
    policy: AbstentionPolicy,
    *,
    include_tokens: bool,
    source: str = "model",
    prompt_format: str | None = None,
) -> tuple[list[Uncertainty], list[str], list[str | None]]:
    """Uncertainty records, client-visible texts and finish reasons of answers under ``policy``
    (:meth:`AbstentionPolicy.decide` of each)."""
    out = [
        policy.decide(a, prompt_format, include_tokens=include_tokens, source=source)
        for a in answers
    ]
    return [d.uncertainty for d in out], [d.text for d in out], [d.finish_reason for d in out]
