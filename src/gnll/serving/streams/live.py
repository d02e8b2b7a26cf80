"""Streaming an in-process answer while it is decoded.

The engine hands over each choice's tokens one decoding step at a time
(:meth:`~gnll.serving.engine.BatchingEngine.stream`).
:class:`~gnll.backends.held.HeldText` sends a token's text as soon as it is certainly part of the
final answer, so that the streamed pieces put together equal the non-streamed answer exactly
(what it holds back, and why, is said there). What is held goes out with the choice's last
pieces, taken from the finished answer itself, then the final chunk with ``finish_reason`` and
the ``uncertainty`` object.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

from gnll.backends.base import StreamingModel
from gnll.backends.held import HeldText, Piece
from gnll.policy import Answer
from gnll.serving import responses as R
from gnll.serving.protocol.common import Shape
from gnll.uncertainty import Uncertainty

log = logging.getLogger("gnll.serve")


class LiveStream:
    """The OpenAI chunks of one streamed request, built as its tokens arrive.

    Parameters
    ----------
    model:
        The in-process :class:`~gnll.backends.base.StreamingModel` (its ``decode`` and
        ``stop_rules``).
    stop:
        The request's stop strings.
    choices:
        Number of choices (prompts x ``n``); choice ``i * n + j`` is sample ``j`` of prompt ``i``.
    n:
        Samples per prompt.
    shape:
        The API's shape (chat ``delta`` chunks or legacy completion ``text`` chunks).
    logprobs:
        Whether chunks carry their tokens' log-probs.
    include_usage:
        End with a ``choices: []`` usage chunk (``stream_options.include_usage``).
    """

    def __init__(
        self,
        model: StreamingModel,
        stop: tuple[str, ...],
        *,
        choices: int,
        n: int,
        shape: Shape,
        logprobs: bool,
        include_usage: bool = False,
        top_logprobs: int = 0,
    ) -> None:
        rules = model.stop_rules(stop)
        self.held = [HeldText(model.decode, rules.token_ids, rules.strings) for _ in range(choices)]
        self.n, self.shape, self.logprobs = n, shape, logprobs
        #: Alternatives per token to send (``top_logprobs``), each choice's as decoded, and how
        #: many of its tokens the pieces sent so far spell.
        self.top = top_logprobs
        self.alts: list[list[dict[str, float]]] = [[] for _ in range(choices)]
        self.spelled = [0] * choices
        self.include_usage = include_usage
        self.offsets = [0] * choices  # characters of tokens sent per choice (``text_offset``)
        self.base = shape.chunk_base(model.name)

    def opening(self) -> list[str]:
        """Chat streams open each choice with the assistant's role."""
        out = []
        for i in range(len(self.held)):
            opening = self.shape.opening(i)
            if opening is not None:
                out.append(self._chunk(opening))
        return out

    def tokens(
        self, items: Sequence[tuple[int, int, int, float, dict[str, float] | None]]
    ) -> list[str]:
        """Chunks for one step's ``(prompt, j, token_id, log-prob, alternatives)`` items."""
        out = []
        for i, j, token, lp, alts in items:
            c = i * self.n + j
            self.alts[c].append(alts or {})
            out += [self._piece(c, p) for p in self.held[c].push(token, lp)]
        return out

    def closing(
        self,
        answers: Sequence[Answer],
        records: Sequence[Uncertainty],
        finishes: Sequence[str | None],
        usage: dict[str, int],
    ) -> list[str]:
        """The held pieces, the final chunk of every choice (with its uncertainty), the usage if
        asked for."""
        out = []
        for c, (answer, rec, finish) in enumerate(zip(answers, records, finishes, strict=True)):
            out += [self._piece(c, p) for p in self.held[c].finish(answer)]
            out.append(self._chunk(self.shape.last(c, finish, rec)))
        if self.include_usage:
            out.append(R.sse({**self.base, "choices": [], "usage": usage}))
        out.append(R.sse("[DONE]"))
        return out

    def _piece(self, c: int, piece: Piece) -> str:
        text, tokens, lps = piece
        lp = None
        start, self.spelled[c] = self.spelled[c], self.spelled[c] + len(tokens)
        if self.logprobs:
            # The alternatives recorded at each of the piece's decoding steps: the same the whole
            # answer reports (the decoding loop names them once, for both).
            alts = self.alts[c][start : start + len(tokens)] if self.top else None
            part = Answer(text, None, tokens, lps, top_logprobs=alts)
            lp = self.shape.piece_logprobs(part, self.offsets[c], self.top)
        self.offsets[c] += sum(len(t) for t in tokens)
        return self._chunk(self.shape.piece(c, text, lp))

    def _chunk(self, choice: dict[str, Any]) -> str:
        return R.sse({**self.base, "choices": [choice]})


async def relay(
    live: LiveStream,
    events: AsyncGenerator[tuple[str, Any], None],
    first: tuple[str, Any],
    finish: Callable[
        [Any], tuple[list[Answer], list[Uncertainty], list[str | None], dict[str, int]]
    ],
) -> AsyncIterator[str]:
    """Server-sent events of a streamed request: chunks as tokens arrive, then the closing ones.

    ``finish`` turns the engine's generations into answers, uncertainty records, finish reasons
    and usage (as for a non-streamed response).
    """
    try:
        for chunk in live.opening():
            yield chunk
        event = first
        try:
            while event[0] == "tokens":
                for chunk in live.tokens(event[1]):
                    yield chunk
                event = await anext(events)
            answers, records, finishes, usage = finish(event[1])
        except Exception as exc:  # headers are out: the client hears of it in the stream
            log.exception("streamed generation failed")
            yield R.sse(R.error_body(f"generation failed: {exc}", "server_error"))
            return
        for chunk in live.closing(answers, records, finishes, usage):
            yield chunk
    finally:
        # Also when the client went away mid-stream: the engine drops the job's rows.
        await events.aclose()
