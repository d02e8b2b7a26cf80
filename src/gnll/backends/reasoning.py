"""Reasoning models: split a generation's tokens into trace, end-of-reasoning marker and answer.

A model that thinks before it answers (``<think>…</think>``, gpt-oss's harmony channels) emits
three runs of tokens: the **trace**, the **marker** that ends it, and the **answer**. Servers report
the log-probs of all of them in ``logprobs.content`` while ``message.content`` holds only the
answer, so scoring ``logprobs.content`` whole scores the trace. gnll's number for a reasoning model
is the *answer-only G-NLL*: the NLL of the answer tokens the model emitted, conditioned on prompt +
trace + marker (the trace is context, not answer).

This module is the model-neutral half, beside the :class:`~gnll.backends.base.Model` contract: the
formats (registered by name, :func:`register_reasoning_format`, as vLLM's reasoning parsers are),
the :class:`ReasoningSplit` a generation carries, and :func:`split_tokens` for plain token strings
(models run in-process with a reasoning template). Reading the split out of an OpenAI-compatible
server's responses and streams (``split_choice``, ``ReasoningStream``, ``reasoning_text``,
``responses_answer_choice``) is the server backend's: :mod:`gnll.backends.openai.reasoning`.

A response that carries reasoning but whose log-probs cannot be aligned with it raises
:class:`ReasoningError`: it is never scored whole.

Examples
--------
>>> tokens = ["Ok", "ay", " 2+2", "</think>", "\\n\\n", "4"]
>>> s = split_tokens(tokens, THINK)
>>> s.trace_tokens, s.marker_tokens, s.answer_tokens, s.split_at
(3, 2, 1, 5)
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gnll.measures.trace import DEEPCONF_WINDOW, token_confidence, trace_confidence

Label = Literal["trace", "marker", "answer"]

__all__ = [
    "HARMONY",
    "THINK",
    "ReasoningError",
    "ReasoningFormat",
    "ReasoningSplit",
    "FORMATS",
    "past_white_space",
    "reported_floats",
    "token_bounds",
    "token_pieces",
    "register_reasoning_format",
    "reasoning_format",
    "split_tokens",
]


class ReasoningError(ValueError):
    """A reasoning model's response whose answer cannot be told apart from its trace."""


@dataclass(frozen=True)
class ReasoningFormat:
    """How a model marks the end of its reasoning.

    Parameters
    ----------
    name:
        ``"think"``, ``"harmony"`` or ``"marker"`` (a user-given marker text).
    end:
        A regular expression matching the end-of-reasoning marker in the generated text: everything
        before its first match is trace, everything after it is answer. The first match, as vLLM's
        and llama.cpp's reasoning parsers take it.
    text:
        The marker's literal text, for a template that has to close a trace itself (in-process).

    Examples
    --------
    >>> reasoning_format("marker:Final answer:").find("I think. Final answer: 4")
    (9, 22)
    >>> HARMONY.find("<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>4")
    (32, 84)
    """

    name: str
    end: str
    text: str

    def find(self, text: str) -> tuple[int, int] | None:
        """``(start, end)`` of the first marker in ``text``, or ``None``."""
        m = re.search(self.end, text, flags=re.DOTALL)
        return (m.start(), m.end()) if m else None

    def find_bytes(self, data: bytes) -> tuple[int, int] | None:
        m = re.search(self.end.encode(), data, flags=re.DOTALL)
        return (m.start(), m.end()) if m else None

    def describe(self) -> str:
        return "harmony `final` channel" if self.name == "harmony" else f"`{self.text}`"


#: DeepSeek-R1, Qwen3, and every model whose trace ends with ``</think>``.
THINK = ReasoningFormat("think", re.escape("</think>"), "</think>")
#: gpt-oss: the ``analysis`` channel is the trace; the answer starts after the ``final`` channel's
#: header. llama.cpp strips ``<|end|>``; the header is what both servers keep.
HARMONY = ReasoningFormat(
    "harmony",
    r"(?:<\|end\|>)?(?:<\|start\|>assistant)?<\|channel\|>final(?:[^<]*)?<\|message\|>",
    "<|channel|>final<|message|>",
)
#: The reasoning formats known by name (:func:`register_reasoning_format` adds one).
FORMATS: dict[str, ReasoningFormat] = {}


def register_reasoning_format(fmt: ReasoningFormat) -> ReasoningFormat:
    """Make ``fmt`` known by its name (``--reasoning NAME``, ``reasoning=NAME``), as vLLM's
    reasoning parsers are registered; a name is registered once.

    >>> register_reasoning_format(THINK)
    Traceback (most recent call last):
    ...
    gnll.backends.reasoning.ReasoningError: reasoning format 'think' is registered already
    """
    if fmt.name in FORMATS or fmt.name == "marker":
        raise ReasoningError(f"reasoning format {fmt.name!r} is registered already")
    FORMATS[fmt.name] = fmt
    return fmt


register_reasoning_format(THINK)
register_reasoning_format(HARMONY)


def reasoning_format(spec: str | ReasoningFormat) -> ReasoningFormat:
    """``"think"``, ``"harmony"`` or ``"marker:TEXT"`` (any literal end-of-reasoning text).

    >>> reasoning_format("think").text, reasoning_format("marker:ANSWER:").name
    ('</think>', 'marker')
    >>> reasoning_format("thinking")
    Traceback (most recent call last):
    ...
    gnll.backends.reasoning.ReasoningError: unknown reasoning format 'thinking': give think, harmony or marker:TEXT
    """
    if isinstance(spec, ReasoningFormat):
        return spec
    if spec in FORMATS:
        return FORMATS[spec]
    if spec.startswith("marker:") and spec[len("marker:") :]:
        text = spec[len("marker:") :]
        return ReasoningFormat("marker", re.escape(text), text)
    known = ", ".join(FORMATS)
    raise ReasoningError(f"unknown reasoning format {spec!r}: give {known} or marker:TEXT")


@dataclass(frozen=True)
class ReasoningSplit:
    """Where a reasoning model's tokens split: ``[0, trace_end)`` trace, ``[trace_end,
    answer_start)`` marker, ``[answer_start, num_tokens)`` answer (terminator included).

    Attributes
    ----------
    trace_logprobs:
        The trace tokens' log-probs (empty when the server did not report them).
    marker_logprobs:
        The marker tokens' log-probs; ``None`` when the server did not send them (llama.cpp
        streams drop the marker's chunk) or when the marker was forced, not generated.
    source:
        How the split was found: ``"marker"`` (the marker's text among the tokens),
        ``"token_ids"``, ``"stream"`` (delta labels), ``"answer-only"`` (the server reported the
        answer's log-probs only), ``"generated"`` (an in-process trace).
    """

    trace_end: int
    answer_start: int
    num_tokens: int
    format: str
    source: str
    trace_logprobs: tuple[float, ...] = ()
    marker_logprobs: tuple[float, ...] | None = ()
    notes: tuple[str, ...] = field(default=())
    #: The trace's text, when known (a server's ``message.reasoning``, an in-process trace).
    trace_text: str | None = None
    #: The log-probs of the alternatives reported at each trace position (DeepConf's token
    #: confidence); ``None``: only the chosen tokens' (:attr:`trace_logprobs`).
    trace_top_logprobs: tuple[tuple[float, ...], ...] | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.trace_end <= self.answer_start <= self.num_tokens:
            raise ValueError(
                f"a split needs 0 <= trace_end <= answer_start <= num_tokens, got "
                f"{self.trace_end}, {self.answer_start}, {self.num_tokens}"
            )

    @property
    def trace_tokens(self) -> int:
        return self.trace_end

    @property
    def marker_tokens(self) -> int:
        return self.answer_start - self.trace_end

    @property
    def answer_tokens(self) -> int:
        """Answer tokens as reported, the terminator included (the answer's measured tokens are
        :attr:`gnll.backends.base.Generation.token_logprobs`)."""
        return self.num_tokens - self.answer_start

    @property
    def split_at(self) -> int:
        """Index of the first answer token among all generated tokens."""
        return self.answer_start

    @property
    def marker_reported(self) -> bool:
        return self.marker_logprobs is not None

    @property
    def trace_nll(self) -> float | None:
        """``-sum`` of the trace's log-probs (``None`` when they were not reported)."""
        if (not self.trace_logprobs and self.trace_end) or not self.trace_reported:
            return None
        return 0.0 - math.fsum(self.trace_logprobs)

    def trace_confidence(self, window: int = DEEPCONF_WINDOW) -> dict[str, Any] | None:
        """DeepConf's confidences of the trace (:func:`gnll.measures.trace.trace_confidence`):
        trace quality for voting among traces, not the answer's uncertainty. ``k``: alternatives
        per position they average over (1: the chosen token only). ``None``: no trace log-probs."""
        if not self.trace_logprobs:
            return None
        tops = self.trace_top_logprobs
        if tops is None or len(tops) != len(self.trace_logprobs) or not all(tops):
            tops, k = tuple((v,) for v in self.trace_logprobs), 1
        else:
            k = min(len(t) for t in tops)
        scores = trace_confidence(token_confidence(tops), window=window)
        return {**scores, "k": k}

    def label(self, i: int) -> Label:
        """Which run token ``i`` belongs to."""
        if not 0 <= i < self.num_tokens:
            raise IndexError(i)
        if i < self.trace_end:
            return "trace"
        return "marker" if i < self.answer_start else "answer"

    @property
    def trace_reported(self) -> bool:
        """Whether the trace's tokens were reported (not so when a server sent the answer's
        log-probs only: then the trace's and marker's counts are unknown, not 0)."""
        return self.source not in ("answer-only", "responses")

    def record(self) -> dict[str, Any]:
        """The fields serving and scoring report next to the answer's G-NLL."""
        if not self.trace_reported:
            return {
                "format": self.format,
                "source": self.source,
                "trace_nll": None,
                "trace_tokens": None,
                "marker_tokens": None,
                "answer_tokens": self.answer_tokens,
                "split_at": None,
                "marker_reported": False,
                **({"notes": list(self.notes)} if self.notes else {}),
            }
        return {
            "format": self.format,
            "source": self.source,
            "trace_nll": self.trace_nll,
            "trace_tokens": self.trace_tokens,
            "marker_tokens": self.marker_tokens,
            "answer_tokens": self.answer_tokens,
            "split_at": self.split_at,
            "marker_reported": self.marker_reported,
            **({"notes": list(self.notes)} if self.notes else {}),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "trace_end": self.trace_end,
            "answer_start": self.answer_start,
            "num_tokens": self.num_tokens,
            "format": self.format,
            "source": self.source,
            "trace_logprobs": list(self.trace_logprobs),
            "marker_logprobs": None if self.marker_logprobs is None else list(self.marker_logprobs),
            "notes": list(self.notes),
            "trace_text": self.trace_text,
            "trace_top_logprobs": None
            if self.trace_top_logprobs is None
            else [list(t) for t in self.trace_top_logprobs],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReasoningSplit:
        marker = d.get("marker_logprobs")
        return cls(
            int(d["trace_end"]),
            int(d["answer_start"]),
            int(d["num_tokens"]),
            str(d["format"]),
            str(d["source"]),
            tuple(float(x) for x in d.get("trace_logprobs") or ()),
            None if marker is None else tuple(float(x) for x in marker),
            tuple(d.get("notes") or ()),
            d.get("trace_text"),
            None
            if d.get("trace_top_logprobs") is None
            else tuple(tuple(float(x) for x in t) for t in d["trace_top_logprobs"]),
        )


def token_pieces(tokens: Sequence[str], token_bytes: Sequence[Sequence[int]] | None) -> list[bytes]:
    if token_bytes is not None and len(token_bytes) == len(tokens):
        return [bytes(b) for b in token_bytes]
    return [t.encode("utf-8") for t in tokens]


def token_bounds(pieces: Sequence[bytes], span: tuple[int, int]) -> tuple[int, int]:
    """Tokens overlapping the byte span ``[a, b)`` are the marker: ``(first, past_last)``."""
    a, b = span
    pos, first, last = 0, None, None
    for i, p in enumerate(pieces):
        start, end = pos, pos + len(p)
        if first is None and end > a:
            first = i
        if start < b:
            last = i + 1
        pos = end
    first = len(pieces) if first is None else first
    return first, max(first, last or first)


def past_white_space(pieces: Sequence[bytes], start: int) -> int:
    """The first token from ``start`` on with text other than white space: the white space a model
    writes after the marker (``"</think>\n\n"``) belongs to the marker, not to the answer. When
    only white space (or nothing) follows, ``start`` itself."""
    i = start
    while i < len(pieces) and pieces[i] and not pieces[i].strip():
        i += 1
    return i if i < len(pieces) else start


def split_tokens(
    tokens: Sequence[str],
    fmt: ReasoningFormat | str = "think",
    *,
    logprobs: Sequence[float | None] | None = None,
    token_bytes: Sequence[Sequence[int]] | None = None,
    token_ids: Sequence[int] | None = None,
    marker_ids: Sequence[int] | None = None,
) -> ReasoningSplit:
    """The split of one generation's tokens at the first end-of-reasoning marker.

    With ``token_ids`` and the marker's own ids (``marker_ids``) the marker is found by id (exact
    even where a token's string is ambiguous); otherwise by the marker's text in the tokens' bytes
    (``token_bytes``, the servers' ``bytes`` field) or strings. Tokens overlapping the marker's
    text are marker tokens.

    Raises
    ------
    ReasoningError
        No marker among the tokens.

    Examples
    --------
    >>> s = split_tokens(["a", "</", "think", ">", "b"], logprobs=[-1.0, -0.1, -0.1, -0.1, -0.5])
    >>> s.trace_tokens, s.marker_tokens, s.answer_tokens, s.trace_nll
    (1, 3, 1, 1.0)
    >>> split_tokens(["a", "X", "b"], token_ids=[5, 9, 6], marker_ids=[9]).split_at
    2
    """
    fmt = reasoning_format(fmt)
    n = len(tokens)
    bounds: tuple[int, int] | None = None
    source = "marker"
    if token_ids is not None and marker_ids and len(token_ids) == n:
        k, ids = len(marker_ids), list(token_ids)
        at = next((i for i in range(n - k + 1) if ids[i : i + k] == list(marker_ids)), None)
        if at is not None:
            bounds, source = (at, at + k), "token_ids"
    if bounds is None:
        pieces = token_pieces(tokens, token_bytes)
        span = fmt.find_bytes(b"".join(pieces))
        if span is None:
            raise ReasoningError(
                f"no end-of-reasoning marker ({fmt.describe()}) among the {n} reported tokens"
            )
        bounds = token_bounds(pieces, span)
    trace_end, answer_start = bounds
    answer_start = past_white_space(token_pieces(tokens, token_bytes), answer_start)
    lps = list(logprobs) if logprobs is not None else None
    return ReasoningSplit(
        trace_end,
        answer_start,
        n,
        fmt.name,
        source,
        reported_floats(lps[:trace_end]) if lps is not None else (),
        reported_floats(lps[trace_end:answer_start]) if lps is not None else (),
    )


def reported_floats(values: Sequence[float | None]) -> tuple[float, ...]:
    """Log-probs as floats; a missing one (``None``) makes the run unreported (``()``)."""
    if any(v is None for v in values):
        return ()
    return tuple(float(v) for v in values)  # type: ignore[arg-type]
