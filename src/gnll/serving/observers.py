"""Who hears about a request's answers: the observers :func:`gnll.serving.create_app` notifies.

Once a request's answers are known (a stream's when it has ended, also when the client left), the
app hands one :class:`Answered` to every observer in its list, in order: the Prometheus metrics
(:class:`~gnll.serving.metrics.Metrics`), the access log's uncertainty fields (:class:`AccessLog`),
the OpenTelemetry events of ``--otel`` (:class:`~gnll.serving.tracing.Emitter`) and any observer
passed to ``create_app(observers=...)``. Each reads the typed records
(:class:`gnll.uncertainty.Uncertainty`); none of them changes what the client gets.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from gnll.uncertainty import Uncertainty

__all__ = ["AccessLog", "Answered", "Observer", "response_id_of"]


@dataclass
class Answered:
    """The answers of one request, once they are known.

    Attributes
    ----------
    records:
        One uncertainty record per choice (empty when a stream broke off before its end).
    response_id:
        The response's ``id`` (``None`` when no body or chunk carried one).
    entry:
        The request's access-log entry, written when the request is logged.
    stream_sent:
        For a stream, whether it was sent to its end (``None``: not a stream).
    stream_error:
        The message of the error event that ended a stream, if one did.
    """

    records: Sequence[Uncertainty]
    response_id: str | None
    entry: dict[str, Any] = field(default_factory=dict)
    stream_sent: bool | None = None
    stream_error: str | None = None


@runtime_checkable
class Observer(Protocol):
    """Anything that hears of every request's answers."""

    def answered(self, event: Answered) -> None: ...


def uncertainty_fields(records: Sequence[Uncertainty]) -> dict[str, Any]:
    """What the access log says about a request's answers (with ``escalate``: which model gave
    each, ``answered_by``, as the entry's ``model`` is the local one)."""
    fields: dict[str, Any] = {
        "choices": len(records),
        "g_nll": [r.g_nll for r in records],
        "num_tokens": [r.num_tokens for r in records],
        "abstain": [r.abstain for r in records],
    }
    if any(r.tool_calls for r in records):  # names and numbers; argument texts are never logged
        fields["tool_calls"] = [
            [
                {
                    "name": c["name"],
                    "g_nll": c["g_nll"],
                    "least_certain_argument": c["least_certain_argument"],
                    "max_argument_nll": c["max_argument_nll"],
                    "withheld": c.get("withheld"),
                }
                for c in r.tool_calls or []
            ]
            for r in records
        ]
    if any(r.answered_by is not None for r in records):
        fields["answered_by"] = [r.answered_by for r in records]
        fields["escalated"] = [bool(r.escalated) for r in records]
    return fields


class AccessLog:
    """Puts the answers' uncertainty into the request's access-log entry (``gnll.serve.access``)."""

    def answered(self, event: Answered) -> None:
        event.entry.update(uncertainty_fields(event.records))
        if event.stream_sent is not None:
            event.entry["stream_sent"] = event.stream_sent
        if event.stream_error is not None:
            event.entry["error"] = event.stream_error


def response_id_of(chunk: str | bytes) -> str | None:
    """The ``id`` of one server-sent-event chunk (``None`` for ``[DONE]`` or an error event)."""
    text = chunk.decode() if isinstance(chunk, bytes) else str(chunk)
    if text.startswith("event: "):  # a named event (/v1/responses, /v1/messages): its data line
        text = text.partition("\n")[2]
    if not text.startswith("data: {"):
        return None
    try:
        data = json.loads(text[6:])
    except ValueError:
        return None
    # the id of a chunk, or of the response / message that a named event carries
    value = data.get("id") or (data.get("response") or data.get("message") or {}).get("id")
    return value if isinstance(value, str) else None
