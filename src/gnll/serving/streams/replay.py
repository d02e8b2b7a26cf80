"""Replaying a finished answer as OpenAI stream chunks.

Used when the whole answer is known before its first piece may go out: under the ``refuse``
policy (the text is known only when the decision is), for a model without a decoding loop, for
requests that ask for ``top_logprobs`` (alternatives are known when a row ends), and in proxy mode
under ``refuse`` (the upstream is asked without streaming).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from gnll.policy import Answer
from gnll.serving.responses import last_piece, new_id, sse


def _pieces(answer: Answer, text: str) -> Sequence[tuple[str, int | None]]:
    """The text cut at token boundaries (with each piece's token index) when the tokens spell it."""
    joined = "".join(answer.tokens)
    if answer.tokens and joined == text:
        return [(tok, t) for t, tok in enumerate(answer.tokens)]
    lead = len(joined) - len(joined.lstrip())
    if answer.tokens and joined.strip() == text:
        pieces: list[tuple[str, int | None]] = []
        pos = 0
        for t, tok in enumerate(answer.tokens):
            start, end = max(pos, lead), min(pos + len(tok), lead + len(text))
            pos += len(tok)
            pieces.append((joined[start:end] if end > start else "", t))
        return pieces
    return [(text, None)]


def _other_fields(message: dict[str, Any]) -> dict[str, Any]:
    """A message's fields besides ``role`` and ``content`` (``reasoning``, ``reasoning_content``,
    ``tool_calls``, vendor fields), as one delta: a replay carries all that a live stream would.

    >>> _other_fields({"role": "assistant", "content": "4", "reasoning": "2+2", "refusal": None})
    {'reasoning': '2+2'}
    """
    extra = {k: v for k, v in message.items() if k not in ("role", "content") and v is not None}
    calls = extra.get("tool_calls")
    if isinstance(calls, list):  # a stream's tool calls carry their position
        extra["tool_calls"] = [
            {"index": n, **c} if isinstance(c, dict) and "index" not in c else c
            for n, c in enumerate(calls)
        ]
    return extra


def stream_chunks(
    body: dict[str, Any], answers: Sequence[Answer], *, chat: bool, include_usage: bool = False
) -> Iterator[str]:
    """Replay a finished response as OpenAI streaming chunks; the uncertainty rides on the last one
    of each choice; a ``choices: []`` usage chunk ends the stream only when ``include_usage``.

    In-process generation finishes a whole batch before any token is known to the server, so the
    pieces follow each other immediately; the stream still has the shape clients expect.
    """
    kind = "chat.completion.chunk" if chat else "text_completion"
    base = {
        "id": body.get("id") or new_id("chatcmpl" if chat else "cmpl"),
        "object": kind,
        "created": body.get("created") or int(time.time()),
        "model": body.get("model"),
    }
    for choice, answer in zip(body["choices"], answers, strict=True):
        i = choice["index"]
        text = choice["message"]["content"] if chat else choice["text"]
        lp = choice.get("logprobs")
        if chat:
            yield sse(
                {
                    **base,
                    "choices": [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
            )
            extra = _other_fields(choice["message"])
            if extra:  # the reasoning trace (and any other field) precedes the answer, as live
                c = {"index": i, "delta": extra, "logprobs": None, "finish_reason": None}
                yield sse({**base, "choices": [c]})
        pieces = (
            _pieces(answer, text) if not choice["uncertainty"].get("refused") else [(text, None)]
        )
        for piece, t in pieces:
            piece_lp = None
            if lp is not None and t is not None:
                if chat:
                    piece_lp = {"content": [lp["content"][t]], "refusal": None}
                else:
                    piece_lp = {
                        k: (v[t : t + 1] if isinstance(v, list) else v) for k, v in lp.items()
                    }
            delta = {"content": piece} if chat else None
            c = {"index": i, "logprobs": piece_lp, "finish_reason": None}
            c.update({"delta": delta} if chat else {"text": piece})
            yield sse({**base, "choices": [c]})
        last: dict[str, Any] = {
            "index": i,
            "logprobs": None,
            "finish_reason": choice["finish_reason"],
            "uncertainty": choice["uncertainty"],
        }
        last.update(last_piece(chat))
        yield sse({**base, "choices": [last]})
    if include_usage:
        yield sse({**base, "choices": [], "usage": body.get("usage")})
    yield sse("[DONE]")
