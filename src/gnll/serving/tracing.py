"""OpenTelemetry output of ``gnll serve --otel``: one ``gen_ai.evaluation.result`` event per score.

For every greedy answer the server emits an event named ``gen_ai.evaluation.result`` (the GenAI
semantic conventions' event for an evaluation of a response) with ``gen_ai.evaluation.name =
"g_nll"`` and the G-NLL as ``gen_ai.evaluation.score.value``, and, when the server is calibrated, a
second one with ``gen_ai.evaluation.name = "p_correct"``. ``gen_ai.evaluation.score.label`` is the
decision: ``answer``, ``abstain`` or ``escalate`` (absent without a policy); ``gen_ai.response.id``
is the response's ``id`` (``resp_…`` on ``/v1/responses``, ``msg_…`` on ``/v1/messages``), so a
tracing backend (Langfuse, Phoenix, any OTLP collector) attaches the scores to the generation;
``gnll.api`` names the API the answer was asked through (``chat.completions``, ``completions``,
``responses``, ``messages``). A reasoning model's events say that the score is the answer's
(``gnll.scored = "answer"``) and carry the trace's NLL and tokens (``gnll.trace_nll``,
``gnll.trace_tokens``) when known. Events go through the OpenTelemetry Logs API in the current context: inside
an instrumented request they carry its trace and span ids.

An answer with tool calls adds one event per call, ``gen_ai.evaluation.name = "tool_call.g_nll"``
with the call's G-NLL as the score and ``sent`` or ``withheld`` as the label, the function's name
(``gen_ai.tool.name``), the call's ``gen_ai.tool.call.id`` when it was sent, its index
(``gnll.tool_call.index``), its least certain argument's path and NLL
(``gnll.tool_call.least_certain_argument``, ``gnll.tool_call.max_argument_nll``) and the paths
over the argument threshold (``gnll.tool_call.arguments_over_threshold``). After an escalation the
local model's withheld calls have events too, with ``gnll.tool_call.local = true`` and the local
model as ``gen_ai.response.model``. Argument texts are never in an event (they may hold what the
gate kept from the client).

Off by default; this module and OpenTelemetry are imported only when it is on (``pip install
'gnll[otel]'``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gnll.serving.observers import Answered

if TYPE_CHECKING:
    from opentelemetry._logs import LoggerProvider
from gnll.uncertainty import Uncertainty

__all__ = ["EVENT_NAME", "Emitter", "configure_provider"]

EVENT_NAME = "gen_ai.evaluation.result"


def _label(record: Uncertainty) -> str | None:
    if record.escalated:
        return "escalate"
    abstain = record.abstain
    return None if abstain is None else "abstain" if abstain else "answer"


class Emitter:
    """Emits the evaluation events of answers through an OpenTelemetry logger.

    Parameters
    ----------
    logger_provider:
        An ``opentelemetry.sdk._logs.LoggerProvider`` (tests pass one with an in-memory exporter);
        ``None``: the global one (:func:`configure_provider`).
    """

    def __init__(self, logger_provider: LoggerProvider | None = None) -> None:
        from opentelemetry import _logs

        provider = logger_provider or _logs.get_logger_provider()
        self.logger = provider.get_logger("gnll.serving")

    def emit(
        self, records: Iterable[Uncertainty], response_id: str | None, api: str | None = None
    ) -> int:
        """One event per score of each greedy answer; returns how many were emitted. ``api``:
        the API the answer was asked through (``chat.completions``, ``responses``, ...)."""
        count = 0
        for record in records:
            if record.g_nll is None:  # a sampled answer has no G-NLL to report
                continue
            for name, value in (("g_nll", record.g_nll), ("p_correct", record.p_correct)):
                if value is None:
                    continue
                attributes: dict[str, Any] = {
                    "gen_ai.evaluation.name": name,
                    "gen_ai.evaluation.score.value": float(value),
                }
                label = _label(record)
                if label is not None:
                    attributes["gen_ai.evaluation.score.label"] = label
                if response_id:
                    attributes["gen_ai.response.id"] = response_id
                if api:
                    attributes["gnll.api"] = api
                if record.answered_by:
                    attributes["gen_ai.response.model"] = record.answered_by
                if record.scored is not None:  # a reasoning model: the answer's, given the trace
                    attributes["gnll.scored"] = record.scored
                    for key in ("trace_nll", "trace_tokens"):
                        if getattr(record, key) is not None:
                            attributes[f"gnll.{key}"] = getattr(record, key)
                early = record.early_decision
                if early is not None:  # decided before the (local) answer's end
                    attributes["gnll.early_decision.token"] = early.decided_at_token
                    attributes["gnll.early_decision.tokens_saved"] = early.tokens_saved
                self.logger.emit(
                    timestamp=time.time_ns(), event_name=EVENT_NAME, attributes=attributes
                )
                count += 1
            calls = [(c, False) for c in record.tool_calls or []]
            if record.local is not None:  # escalated: the local model's calls, withheld
                calls += [(c, True) for c in record.local.tool_calls or []]
            for call, local in calls:
                attributes = _call_attributes(call, record, response_id, api)
                if local:
                    assert record.local is not None
                    attributes["gnll.tool_call.local"] = True
                    attributes["gen_ai.response.model"] = record.local.model
                self.logger.emit(
                    timestamp=time.time_ns(), event_name=EVENT_NAME, attributes=attributes
                )
                count += 1
        return count

    def answered(self, event: Answered) -> None:
        """Emit the events of one request's answers (:mod:`gnll.serving.observers`)."""
        self.emit(event.records, event.response_id, event.entry.get("api"))


def _call_attributes(
    call: dict[str, Any], record: Uncertainty, response_id: str | None, api: str | None
) -> dict[str, Any]:
    """One tool call's event: its name and numbers, never its argument texts."""
    attributes: dict[str, Any] = {
        "gen_ai.evaluation.name": "tool_call.g_nll",
        "gen_ai.evaluation.score.value": float(call["g_nll"]),
        "gen_ai.evaluation.score.label": "withheld" if call.get("withheld") else "sent",
        "gnll.tool_call.index": int(call["index"]),
    }
    if call.get("name"):
        attributes["gen_ai.tool.name"] = str(call["name"])
    if call.get("id"):
        attributes["gen_ai.tool.call.id"] = str(call["id"])
    if call.get("least_certain_argument") is not None:
        attributes["gnll.tool_call.least_certain_argument"] = str(call["least_certain_argument"])
        attributes["gnll.tool_call.max_argument_nll"] = float(call["max_argument_nll"])
    if call.get("p_correct") is not None:
        attributes["gnll.tool_call.p_correct"] = float(call["p_correct"])
    if call.get("arguments_over_threshold"):
        attributes["gnll.tool_call.arguments_over_threshold"] = [
            str(p) for p in call["arguments_over_threshold"]
        ]
    if response_id:
        attributes["gen_ai.response.id"] = response_id
    if api:
        attributes["gnll.api"] = api
    if record.answered_by:
        attributes["gen_ai.response.model"] = record.answered_by
    return attributes


def configure_provider() -> str:
    """Make sure events go somewhere: keep a logger provider already set (e.g. by
    ``opentelemetry-instrument``); else export over OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set
    and the OTLP exporter is installed; else print them to stderr. Returns what it chose."""
    from opentelemetry import _logs
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor, ConsoleLogRecordExporter

    if isinstance(_logs.get_logger_provider(), LoggerProvider):
        return "the configured OpenTelemetry logger provider"
    from opentelemetry.sdk.resources import Resource

    name = os.environ.get("OTEL_SERVICE_NAME", "gnll-serve")
    provider = LoggerProvider(resource=Resource.create({"service.name": name}))
    where = "stderr (set OTEL_EXPORTER_OTLP_ENDPOINT for an OTLP collector)"
    exporter: Any = None
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        try:
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

            exporter, where = OTLPLogExporter(), os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
        except ImportError:
            where = "stderr (OTEL_EXPORTER_OTLP_ENDPOINT is set but opentelemetry-exporter-otlp is not installed)"
    if exporter is None:
        import sys

        exporter = ConsoleLogRecordExporter(out=sys.stderr)
    provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
    _logs.set_logger_provider(provider)
    return where
