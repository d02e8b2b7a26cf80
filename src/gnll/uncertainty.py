"""The ``uncertainty`` record of one answer: G-NLL, its decision, and where in the answer the doubt sits.

One typed home for what every surface says about an answer's uncertainty: ``gnll serve`` puts an
:class:`Uncertainty` on every choice (and its headers, metrics, access log, OpenTelemetry events and
the escalation cascade read it), and the span fields (:func:`span_fields`) are written under the same
names by ``gnll ask``, ``gnll score`` and ``gnll serve``. It sits just above :mod:`gnll.spans` and
:mod:`gnll.measures` (it needs nothing else), so scoring, serving and integrations can all use it.

The JSON of a record (:meth:`Uncertainty.to_json`) always has ``measure``, ``decoding``, ``g_nll``,
``ln_g_nll``, ``nll``, ``num_tokens``, ``p_correct``, ``abstain``, ``spans``, ``spans_kind`` and
``least_certain_span``; the other fields appear only when they say something (``tokens`` when the
client asked for log-probs, ``refused`` when the policy refused the answer, ``answered_by`` and
``local`` under an escalation policy, ...).

``least_certain_span`` is the **path** of the span with the largest NLL (``"2"`` for the second
sentence, ``"$.city"`` for a JSON field), on every surface.

Examples
--------
>>> from gnll.spans import span_nlls
>>> report = span_nlls(["Paris", ".", " Or", " Lyon", "?"], [-0.1, -0.1, -2.0, -3.0, -0.5],
...                    "Paris. Or Lyon?", "sentence")
>>> fields = span_fields(report)
>>> fields["spans_kind"], fields["least_certain_span"], [s["text"] for s in fields["spans"]]
('sentence', '2', ['Paris.', 'Or Lyon?'])
>>> u = Uncertainty(decoding="greedy", g_nll=5.7, ln_g_nll=1.14, nll=5.7, num_tokens=5, **fields)
>>> sorted(u.to_json())[:4], "tokens" in u.to_json()
(['abstain', 'decoding', 'g_nll', 'least_certain_span'], False)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

from gnll.spans import Span, SpanKind, SpanReport, span_nlls

__all__ = [
    "SPAN_FIELDS",
    "LocalAnswer",
    "TraceConfidence",
    "Uncertainty",
    "span_columns",
    "span_fields",
]

#: The span fields of one answer, named alike on every surface (``gnll ask --spans``, ``gnll score
#: --spans``, every ``gnll serve`` answer).
SPAN_FIELDS: tuple[str, ...] = ("spans", "spans_kind", "least_certain_span")

# Fields that are left out of the JSON while they are None (the others are always present).
_OPTIONAL = (
    "prompt_format",
    "tokens",
    "token_logprobs",
    "top_logprobs",
    "refused",
    "answered_by",
    "escalated",
    "local",
    "escalation_error",
    "early",
    "decided_at_token",
    "tokens_generated",
    "tokens_saved",
    "g_nll_is_lower_bound",
    "withheld",
    "scored",
    "trace_nll",
    "trace_tokens",
    "marker_tokens",
    "answer_tokens",
    "split_at",
    "reasoning_format",
    "reasoning_source",
    "trace_confidence",
    "notes",
    "tool_calls",
    "tool_call_error",
    "structured",
)


def span_fields(report: SpanReport | None) -> dict[str, Any]:
    """``spans``, ``spans_kind`` and ``least_certain_span`` (a path) of one answer, as JSON values.

    ``None`` (an answer without spans) gives the three fields as ``None``.
    """
    if report is None:
        return dict.fromkeys(SPAN_FIELDS)
    top = report.least_certain()
    return {
        "spans": [s.to_dict() for s in report.spans],
        "spans_kind": report.kind,
        "least_certain_span": top.path if top is not None else None,
    }


def span_columns(
    tokens: Sequence[str], token_logprobs: Sequence[float], text: str, kind: SpanKind
) -> dict[str, Any]:
    """The span fields of one answer as ``gnll ask --spans`` and ``gnll score --spans`` write them.

    :func:`span_fields` of the answer's ``kind`` spans, with ``max_span_nll`` (the least certain
    span's NLL) and ``unassigned_nll`` (the tokens in no span); when the answer has no spans of that
    kind (no JSON in it), ``spans`` is ``None`` and ``spans_error`` says why.

    >>> cols = span_columns(["{", '"a": ', "1", "}"], [-0.1, -0.2, -1.5, -0.1], '{"a": 1}', "json")
    >>> cols["least_certain_span"], cols["max_span_nll"], round(cols["unassigned_nll"], 3)
    ('$.a', 1.5, 0.4)
    >>> span_columns(["no"], [-0.1], "no", "json")["spans_error"]
    'the answer holds no JSON object or array'
    """
    try:
        report = span_nlls(tokens, [float(x) for x in token_logprobs], text, kind)
    except ValueError as exc:
        return {**dict.fromkeys(SPAN_FIELDS), "spans_kind": kind, "spans_error": str(exc)}
    top = report.least_certain()
    return {
        **span_fields(report),
        "max_span_nll": top.nll if top is not None else None,
        "unassigned_nll": report.unassigned_nll,
    }


class TraceConfidence(BaseModel):
    """DeepConf's confidences of a reasoning model's trace (:mod:`gnll.measures.trace`): how
    peaked the model's distributions were while it reasoned, to rank traces for voting; not the
    answer's uncertainty (its G-NLL is).

    ``lowest_group``: the least confident ``window`` of trace tokens; ``tail``: the last
    ``window``; ``bottom_10pct``: the mean of the lowest 10% of windows; ``k``: alternatives per
    position averaged (1: the chosen token only).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    lowest_group: float | None
    tail: float | None
    bottom_10pct: float | None
    window: int
    k: int


class Uncertainty(BaseModel):
    """The uncertainty of one answer.

    Attributes
    ----------
    measure:
        Always ``"g-nll"``.
    decoding:
        ``"greedy"`` (the answer G-NLL is defined for) or ``"sampled"``.
    g_nll, ln_g_nll:
        G-NLL and its length-normalised form, for a greedy answer (``None`` for a sampled one).
    nll:
        The answer's NLL (G-NLL for a greedy answer; a sample's NLL otherwise).
    num_tokens:
        The answer's tokens.
    p_correct, abstain:
        The policy's probability of a correct answer and its decision (``None`` when it has none).
    prompt_format:
        How the prompt was rendered (:mod:`gnll.backends.prompting`).
    tokens, token_logprobs, top_logprobs:
        The answer's tokens and log-probs, when the client asked for log-probs.
    refused:
        ``True`` when the policy replaced the answer by its refusal (nothing of the answer is kept).
    spans, spans_kind, least_certain_span:
        The NLL of each sentence or JSON field value (:func:`span_fields`).
    answered_by, escalated, local, escalation_error:
        Under ``--policy escalate``: which model answered, whether the answer was escalated, the local
        model's answer (with its ``text`` and ``model``) after an escalation, and why an escalation
        failed.
    early, decided_at_token, tokens_generated, tokens_saved, g_nll_is_lower_bound, withheld:
        When the answer stopped at an exact early decision (``gnll serve --early``, on by default
        under ``refuse``/``escalate``; :mod:`gnll.measures.early`): the answer tokens released when
        the refusal/escalation became certain, the tokens generated and those not generated
        (against ``max_tokens``), and that ``g_nll``/``p_correct``/``num_tokens`` describe that
        prefix (G-NLL a lower bound of the whole answer's); the rest was never generated.
    scored, trace_nll, trace_tokens, marker_tokens, answer_tokens, split_at, reasoning_format,
    reasoning_source, trace_confidence, notes:
        For a reasoning model (:mod:`gnll.backends.reasoning`): ``scored`` is ``"answer"`` (G-NLL
        and every other number above are the answer's, conditioned on prompt + trace);
        the trace's NLL and tokens, the end-of-reasoning marker's tokens, the tokens after it
        (terminator included), the first answer token's index among all generated tokens, the
        format (``think``, ``harmony``, ``marker``), how the split was found (``marker``,
        ``token_ids``, ``stream``, ``answer-only``, ``generated``), the trace's DeepConf
        confidences (:class:`TraceConfidence`) and notes on the split.
    tool_calls, tool_call_error:
        For an answer to a request with tools: per call, its G-NLL, its function name's NLL, each
        argument value's NLL and the token indices each part scored (:func:`gnll.toolcalls.call_report`),
        with the policy's decision on the call; and why an output that tried to call a tool is
        not a call.
    structured:
        For a ``response_format`` JSON answer: how it was decoded (``logprobs``: ``"raw"``, the
        model's distribution, which every NLL above is; ``constrained_g_nll`` and each field's
        ``constrained_nll``: renormalised over the tokens the schema allowed). Through the proxy,
        also for tool calls (``type: "tool_calls"``): which distribution the upstream's log-probs
        are (``"raw"``, ``"constrained"`` by its grammar, or ``"unknown"``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    measure: Literal["g-nll"] = "g-nll"
    decoding: Literal["greedy", "sampled"]
    g_nll: float | None = None
    ln_g_nll: float | None = None
    nll: float
    num_tokens: int
    p_correct: float | None = None
    abstain: bool | None = None
    prompt_format: str | None = None
    tokens: list[str] | None = None
    token_logprobs: list[float] | None = None
    top_logprobs: list[dict[str, float]] | None = None
    refused: bool | None = None
    spans: list[Span] | None = None
    spans_kind: str | None = None
    least_certain_span: str | None = None
    answered_by: str | None = None
    escalated: bool | None = None
    local: LocalAnswer | None = None
    escalation_error: str | None = None
    early: bool | None = None
    decided_at_token: int | None = None
    tokens_generated: int | None = None
    tokens_saved: int | None = None
    g_nll_is_lower_bound: bool | None = None
    withheld: str | None = None
    scored: Literal["answer"] | None = None
    trace_nll: float | None = None
    trace_tokens: int | None = None
    marker_tokens: int | None = None
    answer_tokens: int | None = None
    split_at: int | None = None
    reasoning_format: str | None = None
    reasoning_source: str | None = None
    trace_confidence: TraceConfidence | None = None
    notes: list[str] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_error: str | None = None
    structured: dict[str, Any] | None = None

    @model_serializer(mode="wrap")
    def _present(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in _OPTIONAL:
            if data.get(key) is None:
                data.pop(key, None)
        return data

    @property
    def early_decision(self) -> Uncertainty | None:
        """The record that says where an exact early decision was made: this one (a refusal), the
        local answer's after an escalation, or ``None`` when the decision waited for the end."""
        if self.early:
            return self
        if self.local is not None and self.local.early:
            return self.local
        return None

    def to_json(self) -> dict[str, Any]:
        """The record as the JSON object clients get (fields that say nothing left out)."""
        return self.model_dump()

    def with_spans(self, report: SpanReport | None) -> Uncertainty:
        """This record with the span fields of ``report`` (``None``: no spans)."""
        return self.model_copy(update=span_fields(report) | {"spans": _span_outs(report)})


class LocalAnswer(Uncertainty):
    """The local model's answer after an escalation: its record, its ``text`` and its ``model``."""

    text: str
    model: str


def _span_outs(report: SpanReport | None) -> list[Span] | None:
    return None if report is None else list(report.spans)


Uncertainty.model_rebuild()
