"""Which of an answer's tokens are certainly part of it while it is decoded.

:class:`HeldText` takes one answer's tokens as a decoding loop makes them and releases a token's
text as soon as it is certainly part of the final answer, so that the pieces released put
together equal the finished answer exactly. A stream sends the pieces as they come
(:mod:`gnll.serving.streams.live`); an exact early decision counts only released tokens
(:class:`gnll.backends.decoding.EarlyStop`). It holds back

- text that may be the start of a multi-token stop string (``"Question"`` before a ``":"``
  completes ``"Question:"``): the backend cuts the answer before it;
- tokens that end inside a UTF-8 character (a character split over tokens), until it completes;
- trailing whitespace (the backend strips an answer's ends when the tokens do not spell it);
- everything from a stop token (EOS, a token containing a stop string) on: the answer has ended.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

# The server's logger: what this warns of concerns a streamed answer.
log = logging.getLogger("gnll.serve")

__all__ = ["HeldText", "Piece", "hold_from"]


class Spelled(Protocol):
    """A finished answer as :meth:`HeldText.finish` reads it (``gnll.policy.Answer`` is one)."""

    text: str
    tokens: list[str]
    token_logprobs: list[float]


#: A streamable piece of an answer: its text and the tokens (with log-probs) that spell it.
Piece = tuple[str, list[str], list[float]]


def hold_from(text: str, strings: Sequence[str]) -> int:
    """Where a stop string in ``text``, or one that the next tokens may complete, would start
    (``len(text)`` when none can).

    Examples
    --------
    >>> hold_from("Paris\\nQuest", ["Question:"]), hold_from("Paris", ["Question:"])
    (6, 5)
    """
    at = len(text)
    for s in strings:
        found = text.find(s)
        if found >= 0:
            at = min(at, found)
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                at = min(at, len(text) - k)
                break
    return at


class HeldText:
    """One choice's tokens as they are decoded, and which of them may be sent yet.

    Parameters
    ----------
    decode:
        Token ids -> text (the tokenizer's ``decode``).
    stop_ids:
        Tokens that end an answer (:attr:`~gnll.backends.hf.stopping.StopRules.token_ids`).
    strings:
        Stop strings that can span tokens (:attr:`~gnll.backends.hf.stopping.StopRules.strings`).

    Examples
    --------
    >>> vocab = {1: " Paris", 2: ".", 3: " Quest", 4: "ion", 5: ":"}
    >>> held = HeldText(lambda ids: "".join(vocab[i] for i in ids), {9}, ["Question:"])
    >>> [held.push(i, -0.5) for i in (1, 2, 3, 4)]
    [[(' Paris', [' Paris'], [-0.5])], [('.', ['.'], [-0.5])], [], []]
    >>> held.text
    ' Paris.'
    """

    def __init__(
        self, decode: Callable[[list[int]], str], stop_ids: Collection[int], strings: Sequence[str]
    ) -> None:
        self.decode, self.stop_ids, self.strings = decode, stop_ids, tuple(strings)
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.sent = 0  # tokens sent
        self.text = ""  # their text
        self.closed = False  # a stop token came: the rest is the backend's cut

    def push(self, token: int, logprob: float) -> list[Piece]:
        """Take the next token; the pieces that can be sent now (often one, sometimes none)."""
        self.ids.append(token)
        self.logprobs.append(logprob)
        if self.closed:
            return []
        if token in self.stop_ids:
            self.closed = True
            return []
        pending = self.ids[self.sent :]
        tail = self.decode(pending)
        room = hold_from(self.text + tail, self.strings) - len(self.text)
        for m in range(len(pending), 0, -1):
            piece = tail if m == len(pending) else self.decode(pending[:m])
            if piece and len(piece) <= room and "\ufffd" not in piece and not piece[-1].isspace():
                return self._send(m, piece)
        return []

    def _send(self, m: int, piece: str) -> list[Piece]:
        ids, lps = self.ids[self.sent : self.sent + m], self.logprobs[self.sent : self.sent + m]
        tokens = [self.decode([i]) for i in ids]
        self.sent += m
        self.text += piece
        if "".join(tokens) == piece:  # one chunk per token, as OpenAI streams
            return [(t, [t], [lp]) for t, lp in zip(tokens, lps, strict=True)]
        return [(piece, tokens, lps)]

    def finish(self, answer: Spelled) -> list[Piece]:
        """The pieces of the finished ``answer`` not sent yet."""
        if not answer.text.startswith(self.text) or self.sent > len(answer.tokens):
            # Not expected (see the module docstring); the client already has the text it got.
            log.warning("streamed text %r is not a prefix of the answer %r", self.text, answer.text)
            return []
        rest = answer.text[len(self.text) :]
        tokens = answer.tokens[self.sent :]
        lps = answer.token_logprobs[self.sent : len(answer.tokens)]
        if "".join(tokens) == rest:
            return [(t, [t], [lp]) for t, lp in zip(tokens, lps, strict=True)]
        return [(rest, tokens, lps)] if rest or tokens else []
