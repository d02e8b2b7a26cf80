"""Exact early decisions on tool calls: withhold a call at the token where its NLL, or one of its
argument values' NLL, crosses its threshold, while the output is still being decoded.

:class:`CallWatch` reads an output token by token in the documented call format
(:mod:`gnll.toolcalls`: ``<tool_call>`` blocks around ``{"name": ..., "arguments": {...}}``) and
gives each token to the part of a call it will belong to once the call is complete: the call (the
JSON object, from its ``{`` to the ``}`` that closes it) and, inside it, the function name or one
argument value, by the straddling rule of :func:`gnll.spans.assign_tokens`. A JSON character's part
is known when it is read (a string's content, a number, a key, punctuation), so every token is
placed when it arrives, and the running NLL of a call or an argument value is the NLL
:func:`gnll.toolcalls.call_report` gives the complete call over the same tokens so far. NLLs only
grow as tokens arrive, so once the policy abstains on a call's running G-NLL (its own
:meth:`~gnll.policy.AbstentionPolicy.decide`, a predicate closed upwards), or an argument value's
running NLL is above the argument threshold, the call is withheld whatever comes next: the
decision is exact (:class:`ToolCallDecision`, an :class:`~gnll.measures.early.EarlyDecision`).

The watch assumes the block it reads will be a well-formed call; if the model goes on to break
the format (or is cut by ``max_tokens``) the output would hold no call. ``gnll serve`` therefore
runs the same watch over every finished output too and withholds a call attempt it decided on,
complete or not, so that decoding to the end and stopping at the decision give the same answer.

>>> w = CallWatch(lambda g: g > 5.0, argument_threshold=1.0)
>>> toks = ['<tool_call>\\n{"name": "f", "arguments": {"x": "', 'ab', 'c', '"}}\\n</tool_call>']
>>> [w.push(t, lp) for t, lp in zip(toks, [-0.1, -0.6, -0.7, -0.1])]
[False, False, True, True]
>>> w.decided_call, w.decided_at, w.report()[0]["arguments_over_threshold"]
(0, 3, ['x'])
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gnll.measures.early import Decision, EarlyDecision
from gnll.spans import _key_path
from gnll.toolcalls import CALL_CLOSE, CALL_OPEN

__all__ = ["CallWatch", "ToolCallDecision"]

_SCALAR = set("-+.0123456789eEtruefalsn")


@dataclass
class _Frame:
    kind: str  # "obj" or "arr"
    path: str
    #: obj: "key|end" (after "{"), "key" (after ","), "colon", "value", "next|end";
    #: arr: "value|end" (after "["), "value" (after ","), "next|end"
    state: str
    n: int = 0  # values read (an array's next index)
    key: str = ""  # the key whose value comes next


@dataclass
class _Call:
    """One ``<tool_call>`` block being read."""

    index: int
    start: int | None = None  # the object's first character
    end: int | None = None  # one past its closing brace
    valid: bool = True
    stack: list[_Frame] = field(default_factory=list)
    #: The lexer: inside a string (``"key"``/``"value"``) or a scalar (``"scalar"``), its raw text.
    lexeme: str | None = None
    raw: str = ""
    escape: bool = False
    leaf: str | None = None  # the path of the value being read
    name: str | None = None
    tokens: list[int] = field(default_factory=list)
    parts: dict[str, list[int]] = field(default_factory=dict)  # "name" / argument path -> tokens
    order: list[str] = field(default_factory=list)  # parts in order of appearance


class CallWatch:
    """The running NLLs of the calls in an output being decoded, and the decision on them.

    Parameters
    ----------
    abstains:
        The policy's predicate on a call's G-NLL (``True``: withhold); closed upwards.
    argument_threshold:
        Withhold a call one of whose argument values' NLL is above this (``None``: no such rule).
    max_calls:
        Only the first ``max_calls`` calls are decided (``1`` under ``parallel_tool_calls: false``,
        where only the first call is returned).
    """

    def __init__(
        self,
        abstains: Callable[[float], bool],
        *,
        argument_threshold: float | None = None,
        max_calls: int | None = None,
    ) -> None:
        self.abstains = abstains
        self.argument_threshold = argument_threshold
        self.max_calls = max_calls
        self.text = ""
        self.logprobs: list[float] = []
        self.calls: list[_Call] = []
        self.where: list[tuple[int, str | None]] = []  # per character: (call, part) or (-1, None)
        #: "outside" a block, "open" (after its tag, before the object), "json", "after" (the
        #: object closed, or the block broke the format: until the closing tag)
        self._state = "outside"
        self._tag = 0  # where the current tag search starts
        self.decided_call: int | None = None
        #: Tokens read when the decision was made (the crossing token included).
        self.decided_at: int | None = None

    @property
    def decided(self) -> bool:
        return self.decided_call is not None

    # ------------------------------------------------------------------ reading
    def push(self, token: str, logprob: float) -> bool:
        """Read the next token; ``True`` once a call is decided (withheld)."""
        k = len(self.logprobs)
        begin = len(self.text)
        self.text += token
        self.logprobs.append(float(logprob))
        for pos in range(begin, len(self.text)):
            self.where.append(self._char(pos))
        if self.decided:
            return True
        chars = range(begin, len(self.text))
        solid = [c for c in chars if not self.text[c].isspace()] or list(chars)
        counts: dict[int, int] = {}
        for c in solid:
            n = self.where[c][0]
            if n >= 0:
                counts[n] = counts.get(n, 0) + 1
        if not counts:
            return False
        owner = max(sorted(counts), key=lambda n: counts[n])  # ties: the earlier call
        call = self.calls[owner]
        call.tokens.append(k)
        parts: dict[tuple[int, str], int] = {}
        for c in solid:
            n, part = self.where[c]
            if part is not None:
                parts[(n, part)] = parts.get((n, part), 0) + 1
        if parts:
            # ties: the earlier part (gnll.toolcalls lists a call's name first, then its arguments)
            def rank(np: tuple[int, str]) -> tuple[int, int]:
                order = self.calls[np[0]].order
                return np[0], order.index(np[1])

            best = max(sorted(parts, key=rank), key=lambda np: parts[np])
            if best[0] == owner:  # a part of another call is this call's structure
                call.parts.setdefault(best[1], []).append(k)
        self._decide(call, k)
        return self.decided

    def read(self, tokens: Sequence[str], logprobs: Sequence[float]) -> CallWatch:
        """Read a finished output's tokens until a call is decided (the decision a decoding
        loop stopped at, or would have: ``gnll serve`` reads every finished output with it)."""
        for tok, lp in zip(tokens, logprobs, strict=True):
            if self.push(tok, lp):
                break
        return self

    def _decide(self, call: _Call, k: int) -> None:
        if not call.valid or (self.max_calls is not None and call.index >= self.max_calls):
            return
        over = self.abstains(self._nll(call.tokens))
        if not over and self.argument_threshold is not None:
            over = any(
                self._nll(ks) > self.argument_threshold
                for p, ks in call.parts.items()
                if p != "name"
            )
        if over:
            self.decided_call, self.decided_at = call.index, k + 1

    def _nll(self, ks: Sequence[int]) -> float:
        # as gnll.toolcalls.call_report sums (a correctly rounded sum: the same bits in any order)
        return 0.0 - math.fsum(self.logprobs[k] for k in ks)

    # ------------------------------------------------------------------ characters
    def _char(self, pos: int) -> tuple[int, str | None]:
        """The call and part character ``pos`` belongs to (``(-1, None)``: outside every call)."""
        ch = self.text[pos]
        if self._state == "outside":
            if self.text.find(CALL_OPEN, self._tag, pos + 1) >= 0:
                self.calls.append(_Call(len(self.calls)))
                self._state, self._tag = "open", pos + 1
            return -1, None
        if self._state == "after":
            call = self.calls[-1]
            if call.valid and call.end is not None:
                # only white space may come between the object and the closing tag
                rest = self.text[call.end : pos + 1].lstrip()
                if not (CALL_CLOSE.startswith(rest) or rest.startswith(CALL_CLOSE)):
                    call.valid = False
            if self.text.find(CALL_CLOSE, self._tag, pos + 1) >= 0:
                self._state, self._tag = "outside", pos + 1
            return -1, None
        call = self.calls[-1]
        if self._state == "open":
            if ch.isspace():
                return -1, None
            if ch != "{":
                call.valid = False
                self._state = "after"
                return -1, None
            call.start = pos
            call.stack.append(_Frame("obj", "$", "key|end"))
            self._state = "json"
            return call.index, None
        part = self._json(call, ch, pos)
        if not call.valid:
            self._state = "after"
            return -1, None
        if call.end is not None:
            self._state = "after"
        if part is not None and part not in call.order:
            if part == "name":
                call.order.insert(0, part)
            else:
                call.order.append(part)
        return call.index, part

    def _json(self, call: _Call, ch: str, pos: int) -> str | None:
        """Advance the call's JSON by one character; the part (``"name"``, an argument's path)
        the character belongs to, ``None`` for the object's structure."""
        if call.lexeme in ("key", "value"):
            if call.escape:
                call.escape = False
            elif ch == "\\":
                call.escape = True
            elif ch == '"':
                kind, call.lexeme = call.lexeme, None
                try:
                    value = json.loads(f'"{call.raw}"')
                except ValueError:
                    call.valid = False
                    return None
                if kind == "key":
                    call.stack[-1].key, call.stack[-1].state = value, "colon"
                else:
                    if call.leaf == "$.name":
                        call.name = value
                    self._ended_value(call)
                return None
            call.raw += ch
            return _part(call.leaf) if call.lexeme == "value" else None
        if call.lexeme == "scalar":
            if ch in _SCALAR:
                call.raw += ch
                return _part(call.leaf)
            call.lexeme = None
            try:
                json.loads(call.raw)
            except ValueError:
                call.valid = False
                return None
            self._ended_value(call)
            return self._json(call, ch, pos)
        if ch.isspace():
            return None
        frame = call.stack[-1]
        state = frame.state
        if state in ("value", "value|end"):
            if state == "value|end" and ch == "]":
                return self._close(call, pos)
            if frame.kind == "obj":
                path = _key_path(frame.path, frame.key)
            else:
                path = f"{frame.path}[{frame.n}]"
            if ch == "{":
                call.stack.append(_Frame("obj", path, "key|end"))
            elif ch == "[":
                call.stack.append(_Frame("arr", path, "value|end"))
            elif ch == '"':
                call.lexeme, call.raw, call.leaf = "value", "", path
            elif ch in _SCALAR:
                call.lexeme, call.raw, call.leaf = "scalar", ch, path
                return _part(path)
            else:
                call.valid = False
            return None
        if state in ("key|end", "key"):
            if state == "key|end" and ch == "}":
                return self._close(call, pos)
            if ch == '"':
                call.lexeme, call.raw = "key", ""
            else:
                call.valid = False
            return None
        if state == "colon":
            if ch == ":":
                frame.state = "value"
            else:
                call.valid = False
            return None
        if ch == ",":  # "next|end"
            frame.state = "key" if frame.kind == "obj" else "value"
            return None
        if ch == ("}" if frame.kind == "obj" else "]"):
            return self._close(call, pos)
        call.valid = False
        return None

    @staticmethod
    def _ended_value(call: _Call) -> None:
        frame = call.stack[-1]
        frame.state, frame.n = "next|end", frame.n + 1

    def _close(self, call: _Call, pos: int) -> None:
        call.stack.pop()
        if call.stack:
            self._ended_value(call)
        else:
            call.end = pos + 1
        return None

    # ------------------------------------------------------------------ the record
    def report(self) -> list[dict[str, Any]]:
        """Each call read so far: its name (when read whole), running G-NLL and argument NLLs,
        the tokens each covers, and the decision (``abstain``, ``arguments_over_threshold``)."""
        out = []
        for call in self.calls:
            if call.start is None:
                continue
            args = [
                {
                    "path": p,
                    "nll": self._nll(call.parts.get(p, [])),
                    "num_tokens": len(call.parts.get(p, [])),
                    "token_indices": list(call.parts.get(p, [])),
                }
                for p in call.order
                if p != "name"
            ]
            top = max(args, key=lambda a: a["nll"], default=None)
            g = self._nll(call.tokens)
            over = None
            if self.argument_threshold is not None:
                over = [a["path"] for a in args if a["nll"] > self.argument_threshold]
            out.append(
                {
                    "index": call.index,
                    "name": call.name,
                    "complete": call.end is not None and call.valid,
                    "g_nll": g,
                    "num_tokens": len(call.tokens),
                    "token_indices": list(call.tokens),
                    "name_nll": self._nll(call.parts.get("name", [])),
                    "name_tokens": list(call.parts.get("name", [])),
                    "arguments": args,
                    "least_certain_argument": top["path"] if top is not None else None,
                    "max_argument_nll": top["nll"] if top is not None else None,
                    "abstain": bool(self.abstains(g)),
                    "arguments_over_threshold": over,
                }
            )
        return out


def _part(path: str | None) -> str | None:
    """A leaf's part: ``"name"``, an argument's path relative to ``arguments``, or ``None``."""
    if path == "$.name":
        return "name"
    if path is not None and path.startswith(("$.arguments.", "$.arguments[")):
        return path[len("$.arguments") :].lstrip(".")
    return None


class ToolCallDecision(EarlyDecision):
    """An :class:`~gnll.measures.early.EarlyDecision` for an output that may hold tool calls: it
    decides when a :class:`CallWatch` withholds a call (not on the whole output's G-NLL: an output
    with calls is decided per call). The decoding loop releases token texts with their log-probs.
    """

    def __init__(
        self,
        abstains: Callable[[float], bool],
        *,
        action: str = "refuse",
        argument_threshold: float | None = None,
        max_calls: int | None = None,
        where: str = "answer",
    ) -> None:
        self.watch = CallWatch(abstains, argument_threshold=argument_threshold, max_calls=max_calls)
        super().__init__(abstains, action=action, where=where)

    def release(self, logprobs: Sequence[float], tokens: Sequence[str] | None = None) -> Decision:
        if tokens is None or len(tokens) != len(logprobs):
            raise ValueError("a tool call's early decision needs each released token's text")
        for tok, lp in zip(tokens, logprobs, strict=True):
            if self.decided:
                break
            self.logprobs.append(float(lp))
            if self.watch.push(tok, lp):
                call = self.watch.report()[self.watch.decided_call or 0]
                self.decision = Decision(
                    "decided", self.action, len(self.logprobs), self.generated, call["g_nll"]
                )
        return self.decision

    def push_token(self, token: str, logprob: float) -> bool:
        """One generated token, released at once (a loop without stop strings); ``True`` once
        decided."""
        self.generated += 1
        return self.release([logprob], [token]).state == "decided"

    def _check(self) -> None:
        return None  # decided by the watch, token by token
