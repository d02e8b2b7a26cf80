"""OpenAI-shaped response bodies and server-sent-event chunks for answers gnll generated itself.

An :class:`~gnll.policy.Answer` is what either mode knows about one choice; the builders here turn answers and
their ``uncertainty`` records into ``text_completion`` / ``chat.completion`` objects that the
official ``openai`` client parses. Streams are built in :mod:`gnll.serving.streams`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gnll.policy import Answer

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


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


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


def completion_logprobs(answer: Answer, top: int) -> dict[str, Any]:
    """Legacy completions ``logprobs``: parallel lists of tokens, log-probs and text offsets."""
    offsets, pos = [], 0
    for tok in answer.tokens:
        offsets.append(pos)
        pos += len(tok)
    tops = None
    if top and answer.top_logprobs is not None:
        tops = [dict(list(t.items())[:top]) for t in answer.top_logprobs]
    return {
        "tokens": list(answer.tokens),
        "token_logprobs": list(answer.token_logprobs),
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def chat_logprobs(answer: Answer, top: int) -> dict[str, Any]:
    """Chat ``logprobs``: one ``content`` entry per token with its top alternatives."""
    content = []
    for t, (tok, lp) in enumerate(zip(answer.tokens, answer.token_logprobs, strict=True)):
        alts = []
        if top and answer.top_logprobs is not None:
            alts = [
                {"token": k, "logprob": v, "bytes": list(k.encode())}
                for k, v in list(answer.top_logprobs[t].items())[:top]
            ]
        content.append(
            {"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": alts}
        )
    return {"content": content, "refusal": None}


def usage(prompt_tokens: int, answers: Sequence[Answer]) -> dict[str, int]:
    done = sum(
        a.completion_tokens if a.completion_tokens is not None else len(a.tokens) for a in answers
    )
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": done,
        "total_tokens": prompt_tokens + done,
    }


def completion_body(
    model: str,
    answers: Sequence[Answer],
    texts: Sequence[str],
    finishes: Sequence[str | None],
    records: Sequence[Uncertainty],
    *,
    logprobs: int | None,
    prompt_tokens: int,
) -> dict[str, Any]:
    choices = []
    for i, (a, text, finish, rec) in enumerate(zip(answers, texts, finishes, records, strict=True)):
        lp = completion_logprobs(a, logprobs or 0) if logprobs is not None else None
        if rec.refused:  # refused: the log-probs describe the text that was withheld
            lp = None
        choices.append(
            {
                "index": i,
                "text": text,
                "logprobs": lp,
                "finish_reason": finish,
                "uncertainty": rec.to_json(),
            }
        )
    return {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, answers),
    }


def chat_body(
    model: str,
    answers: Sequence[Answer],
    texts: Sequence[str],
    finishes: Sequence[str | None],
    records: Sequence[Uncertainty],
    *,
    logprobs: bool,
    top_logprobs: int,
    prompt_tokens: int,
) -> dict[str, Any]:
    choices = []
    for i, (a, text, finish, rec) in enumerate(zip(answers, texts, finishes, records, strict=True)):
        lp = chat_logprobs(a, top_logprobs) if logprobs and not rec.refused else None
        message = {"role": "assistant", "content": text, "refusal": None}
        trace = getattr(a.reasoning, "trace_text", None)
        if trace is not None and not rec.refused:
            # A reasoning model's trace, where vLLM's reasoning parsers put it (a refused
            # answer's trace is withheld with it).
            message["reasoning"] = trace
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": lp,
                "finish_reason": finish,
                "uncertainty": rec.to_json(),
            }
        )
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage(prompt_tokens, answers),
    }


def last_piece(chat: bool) -> dict[str, Any]:
    """The empty content of a choice's last stream chunk (the one with its finish reason)."""
    return {"delta": {}} if chat else {"text": ""}


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
