"""OpenAI-shaped response bodies and server-sent-event chunks for answers gnll generated itself.

An :class:`~gnll.policy.Answer` is what either mode knows about one choice, and a :class:`Reply`
what a service returns for one request. The bodies and chunks themselves are built by each API's
shape (:mod:`gnll.serving.protocol`); streams are put together in :mod:`gnll.serving.streams`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gnll.policy import Answer
from gnll.serving.protocol.common import new_id

__all__ = ["Answer", "Mark", "Reply", "error_body", "new_id", "sse", "stream_error"]

if TYPE_CHECKING:
    from gnll.uncertainty import Uncertainty


@dataclass
class Reply:
    """What a service returns for one request: the body, or a stream that ends with it."""

    body: dict[str, Any] | None
    records: list[Uncertainty]
    stream: Iterator[str] | AsyncIterator[str] | None = None
    prompt: str | None = None
    status: int = 200
    #: Headers of a live stream whose records are only known at its end (``X-Answered-By`` of an
    #: escalated answer streamed as the larger model produces it).
    headers: dict[str, str] | None = None
    #: The model that answered, as the answer names it (a live stream's: set at its first chunk).
    model: str | None = None
    #: Why a live stream ended in an error event (set before the event is sent), else ``None``.
    error: str | None = None
    #: The answers as the body sends them (the policy's text, the log-probs it lists), when the
    #: body is known: what a service that holds this reply replays or keeps of it.
    answers: list[Answer] | None = None
    #: How a service that holds this reply replays its body as a stream (``body`` and whether to
    #: end with a usage chunk), when the answers' own replay does not carry all of it (a tool
    #: call's deltas: :mod:`gnll.serving.tools`); ``None``: the answers' replay.
    replay: Callable[[dict[str, Any], bool], Iterator[str]] | None = None


#: Turns a reply's records into the ones sent, given the model that answered (the escalation
#: cascade's: who answered, and the local answer it replaces).
Mark = Callable[[list["Uncertainty"], "str | None"], list["Uncertainty"]]


def error_body(
    message: str, type_: str, *, param: str | None = None, code: str | int | None = None
) -> dict[str, Any]:
    """The OpenAI error envelope (the ``openai`` client raises it as ``APIStatusError.message``).

    ``code`` is a string or null, as OpenAI types it: a strictly typed client (``Option<String>``)
    fails on an integer, so an upstream's numeric code (vLLM sends the HTTP status) is dropped.

    Examples
    --------
    >>> error_body("no such model", "invalid_request_error", code=404)["error"]["code"] is None
    True
    """
    code = code if isinstance(code, str) and code else None
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event line (``[DONE]`` is sent verbatim, as OpenAI does)."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


def stream_error(chunk: str) -> str | None:
    """The message of an error event (a stream that broke after its headers went out), or ``None``.

    Examples
    --------
    >>> stream_error(sse(error_body("upstream broke off", "upstream_error")))
    'upstream broke off'
    >>> stream_error(sse("[DONE]")) is None
    True
    >>> stream_error('event: error\\ndata: {"type": "error", "message": "cut"}\\n\\n')
    'cut'
    """
    if chunk.startswith("event: error\n"):  # a named error event (/v1/responses, /v1/messages)
        try:
            data = json.loads(chunk.partition("\n")[2][6:])
        except ValueError:
            return "error event"
        err = data.get("error", data) if isinstance(data, dict) else data
        return str(err.get("message") if isinstance(err, dict) else err)
    if not chunk.startswith('data: {"error"'):
        return None
    try:
        err = json.loads(chunk[6:])["error"]
    except (ValueError, KeyError, TypeError):
        return "error event"
    return str(err.get("message") if isinstance(err, dict) else err)
