"""Replaying a finished answer as OpenAI stream chunks.

Used when the whole answer is known before its first piece may go out: under the ``refuse``
policy (the text is known only when the decision is), for a model without a decoding loop, for
requests that ask for ``top_logprobs`` (alternatives are known when a row ends), and in proxy mode
under ``refuse`` (the upstream is asked without streaming).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from gnll.backends.openai.parse import logprob_pairs
from gnll.policy import Answer
from gnll.serving.responses import sse

if TYPE_CHECKING:
    from gnll.serving.protocol.common import Shape


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


def stream_chunks(
    body: dict[str, Any], answers: Sequence[Answer], shape: Shape, include_usage: bool = False
) -> Iterator[str]:
    """Replay a finished response as OpenAI streaming chunks; the uncertainty rides on the last one
    of each choice; a ``choices: []`` usage chunk ends the stream only when ``include_usage``.

    In-process generation finishes a whole batch before any token is known to the server, so the
    pieces follow each other immediately; the stream still has the shape clients expect.
    """
    base = shape.chunk_base(body.get("model"), id=body.get("id"), created=body.get("created"))
    for choice, answer in zip(body["choices"], answers, strict=True):
        i = choice["index"]
        text = shape.text_of(choice)
        lp = choice.get("logprobs")
        opening = shape.opening(i)
        if opening is not None:
            yield sse({**base, "choices": [opening]})
        carried = shape.carried(i, choice)
        pieces = (
            _pieces(answer, text) if not choice["uncertainty"].get("refused") else [(text, None)]
        )
        if carried is not None:  # the reasoning trace (and any other field) precedes the answer
            if (
                lp is not None
                and carried["delta"].get("tool_calls")
                and all(t is None for _, t in pieces)
            ):
                # The tokens spell the calls, not the text: their log-probs ride with the calls.
                carried["logprobs"], lp = lp, None
            yield sse({**base, "choices": [carried]})
        for piece, t in pieces:
            piece_lp = shape.slice_logprobs(lp, t) if lp is not None and t is not None else None
            yield sse({**base, "choices": [shape.piece(i, piece, piece_lp)]})
        last = shape.last(i, choice["finish_reason"], choice["uncertainty"])
        yield sse({**base, "choices": [last]})
    if include_usage:
        yield sse({**base, "choices": [], "usage": body.get("usage")})
    yield sse("[DONE]")


def sent_answers(body: dict[str, Any], shape: Shape) -> list[Answer]:
    """The answers of a finished body as it sends them: each choice's text and finish reason, with
    the tokens its ``logprobs`` list (none when the client did not ask), so that a replay of the
    body carries them piece by piece."""
    out = []
    for choice in body["choices"]:
        pairs = logprob_pairs(choice.get("logprobs"))
        tokens, lps = [t for t, _ in pairs], [lp for _, lp in pairs]
        out.append(Answer(shape.text_of(choice), choice.get("finish_reason"), tokens, lps))
    return out
