"""Reasoning models: split a generation's tokens into trace, end-of-reasoning marker and answer.

A model that thinks before it answers (``<think>…</think>``, gpt-oss's harmony channels) emits
three runs of tokens: the **trace**, the **marker** that ends it, and the **answer**. Servers report
the log-probs of all of them in ``logprobs.content`` while ``message.content`` holds only the
answer, so scoring ``logprobs.content`` whole scores the trace. gnll's number for a reasoning model
is the *answer-only G-NLL*: the NLL of the answer tokens the model emitted, conditioned on prompt +
trace + marker (the trace is context, not answer). This module is the one place that finds the
split, for every response shape and surface:

* a whole response (:func:`split_choice`): vLLM / llama.cpp / sglang chat or completions choices,
  sliced at the marker in the reported tokens (or at the marker's token ids, when the server
  returned ``token_ids`` and the marker's ids are known);
* a stream (:class:`ReasoningStream`): each token labelled by the delta it came with
  (``reasoning`` / ``reasoning_content`` = trace, ``content`` = answer; a token that came with an
  empty delta sits between them: the marker, which vLLM sends as an empty-delta chunk and
  llama.cpp does not send at all, :attr:`ReasoningSplit.marker_reported`);
* the Responses API's ``output_text.logprobs`` (:func:`responses_answer_choice`): answer-aligned
  by construction;
* plain token strings (:func:`split_tokens`), for models run in-process with a reasoning template.

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
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from gnll.measures.trace import DEEPCONF_WINDOW, token_confidence, trace_confidence

Label = Literal["trace", "marker", "answer"]

__all__ = [
    "HARMONY",
    "THINK",
    "ReasoningError",
    "ReasoningFormat",
    "ReasoningSplit",
    "ReasoningStream",
    "reasoning_format",
    "reasoning_text",
    "responses_answer_choice",
    "split_choice",
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
FORMATS = {"think": THINK, "harmony": HARMONY}


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
    raise ReasoningError(f"unknown reasoning format {spec!r}: give think, harmony or marker:TEXT")


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


def _pieces(tokens: Sequence[str], token_bytes: Sequence[Sequence[int]] | None) -> list[bytes]:
    if token_bytes is not None and len(token_bytes) == len(tokens):
        return [bytes(b) for b in token_bytes]
    return [t.encode("utf-8") for t in tokens]


def _bounds(pieces: Sequence[bytes], span: tuple[int, int]) -> tuple[int, int]:
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


def _past_white_space(pieces: Sequence[bytes], start: int) -> int:
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
        pieces = _pieces(tokens, token_bytes)
        span = fmt.find_bytes(b"".join(pieces))
        if span is None:
            raise ReasoningError(
                f"no end-of-reasoning marker ({fmt.describe()}) among the {n} reported tokens"
            )
        bounds = _bounds(pieces, span)
    trace_end, answer_start = bounds
    answer_start = _past_white_space(_pieces(tokens, token_bytes), answer_start)
    lps = list(logprobs) if logprobs is not None else None
    return ReasoningSplit(
        trace_end,
        answer_start,
        n,
        fmt.name,
        source,
        _floats(lps[:trace_end]) if lps is not None else (),
        _floats(lps[trace_end:answer_start]) if lps is not None else (),
    )


def _floats(values: Sequence[float | None]) -> tuple[float, ...]:
    """Log-probs as floats; a missing one (``None``) makes the run unreported (``()``)."""
    if any(v is None for v in values):
        return ()
    return tuple(float(v) for v in values)  # type: ignore[arg-type]


def reasoning_text(container: dict[str, Any] | None) -> str | None:
    """The reasoning a message or delta carries (``reasoning``, or the older
    ``reasoning_content`` of vLLM < 0.26, llama.cpp and sglang), or ``None``.

    >>> reasoning_text({"reasoning_content": "hm", "content": "4"}), reasoning_text({"content": "4"})
    ('hm', None)
    """
    if not isinstance(container, dict):
        return None
    for key in ("reasoning", "reasoning_content"):
        value = container.get(key)
        if isinstance(value, str):
            return value
    return None


def _entries(choice: dict[str, Any]) -> tuple[list[str], list[Any], list[list[int]] | None]:
    """Token strings, log-probs and bytes of a choice (either log-prob shape)."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return [], [], None
    if isinstance(lp.get("content"), list):
        entries = lp["content"]
        tokens = [str(e.get("token", "")) for e in entries]
        values = [e.get("logprob") for e in entries]
        bl = [e.get("bytes") for e in entries]
        return tokens, values, (bl if bl and all(isinstance(b, list) for b in bl) else None)
    tokens = [str(t) for t in lp.get("tokens") or []]
    return tokens, list(lp.get("token_logprobs") or []), None


def _tops(choice: dict[str, Any]) -> list[tuple[float, ...]]:
    """The reported alternatives' log-probs at each position (either shape; empty if none)."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return []
    if isinstance(lp.get("content"), list):
        rows = [e.get("top_logprobs") or [] for e in lp["content"]]
        return [
            tuple(
                float(a["logprob"])
                for a in r
                if isinstance(a, dict) and a.get("logprob") is not None
            )
            for r in rows
        ]
    rows = lp.get("top_logprobs") or []
    return [
        tuple(float(v) for v in r.values() if v is not None) if isinstance(r, dict) else ()
        for r in rows
    ]


def _with_tops(split: ReasoningSplit, tops: Sequence[tuple[float, ...]]) -> ReasoningSplit:
    if len(tops) < split.trace_end or not all(tops[: split.trace_end]):
        return split
    return replace(split, trace_top_logprobs=tuple(tops[: split.trace_end]))


def _slice_choice(choice: dict[str, Any], start: int, answer_text: str | None) -> dict[str, Any]:
    """``choice`` with its log-probs (and ``token_ids``) from token ``start`` on."""
    out = dict(choice)
    lp = dict(choice["logprobs"])
    if isinstance(lp.get("content"), list):
        lp["content"] = lp["content"][start:]
    else:
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            if isinstance(lp.get(key), list):
                lp[key] = lp[key][start:]
        lp.pop("text_offset", None)  # offsets into the whole text; the answer has its own
    out["logprobs"] = lp
    if isinstance(choice.get("token_ids"), list):
        out["token_ids"] = choice["token_ids"][start:]
    if answer_text is not None:
        if isinstance(out.get("message"), dict):
            out["message"] = {**out["message"], "content": answer_text}
        else:
            out["text"] = answer_text
    return out


def _aligned_text(pieces: Sequence[bytes], content: str) -> str | None:
    """``content`` as the answer tokens render it: the tokens' text must start with it, up to
    white space a reasoning parser strips between the marker and the answer (``"\\n\\n"``).
    ``None``: it does not align."""
    joined = b"".join(pieces).decode("utf-8", errors="replace")
    if joined.startswith(content):
        return content
    stripped = joined.lstrip()
    lead = joined[: len(joined) - len(stripped)]
    if stripped.startswith(content.lstrip()):
        return lead + content.lstrip()
    return None


def split_choice(
    choice: dict[str, Any],
    fmt: ReasoningFormat | str | None = None,
    *,
    marker_ids: Sequence[int] | None = None,
    labels: Sequence[Label | None] | None = None,
) -> tuple[dict[str, Any], ReasoningSplit | None]:
    """Split one ``choices[i]`` of a server response; returns the answer's choice and the split.

    The answer's choice has the same shape, with the log-probs (and ``token_ids``) of the answer
    tokens only, and its text the answer's, so the ordinary response parser reads it. A choice
    without reasoning (no ``reasoning``/``reasoning_content`` and no ``fmt`` given) comes back
    unchanged with ``None``: non-reasoning responses are untouched.

    ``fmt``: the model's reasoning format; ``None`` tries ``</think>`` then harmony when the
    response carries reasoning. ``labels``: per-token labels from a stream
    (:class:`ReasoningStream`), which take precedence over the marker's text.

    Raises
    ------
    ReasoningError
        The response carries reasoning but its log-probs cannot be aligned with it (no marker, the
        answer text is not what the tokens after the marker say).
    """
    message = choice.get("message")
    container = message if isinstance(message, dict) else choice
    reasoning = reasoning_text(container)
    if not reasoning and fmt is None and labels is None:
        return choice, None
    tokens, values, token_bytes = _entries(choice)
    if not isinstance(choice.get("logprobs"), dict):
        return choice, None  # the parser says "no log-probs" in its own words
    content = container.get("content") if isinstance(message, dict) else choice.get("text")
    content = content or ""
    pieces = _pieces(tokens, token_bytes)
    formats = [reasoning_format(fmt)] if fmt is not None else [THINK, HARMONY]
    if labels is not None:
        split = _split_labels(list(labels), values, formats[0], pieces)
    else:
        split = None
        for f in formats:
            try:
                split = split_tokens(
                    tokens,
                    f,
                    logprobs=values,
                    token_bytes=token_bytes,
                    token_ids=choice.get("token_ids") if marker_ids else None,
                    marker_ids=marker_ids,
                )
                break
            except ReasoningError:
                continue
        if split is None:
            joined = b"".join(pieces).decode("utf-8", errors="replace")
            markers = " or ".join(f.describe() for f in formats)
            if reasoning and content and joined.strip() == content.strip():
                # The server reported the answer's log-probs only (no trace among them).
                split = ReasoningSplit(0, 0, len(tokens), formats[0].name, "answer-only")
            elif choice.get("finish_reason") == "length" and (reasoning or fmt is not None):
                raise ReasoningError(
                    f"the output hit max_tokens inside the reasoning (no {markers} among its "
                    f"{len(tokens)} tokens): there is no answer to score; allow more tokens"
                )
            elif reasoning:
                raise ReasoningError(
                    "the response carries reasoning (`message.reasoning`) but its log-probs cannot "
                    f"be aligned with it: no end-of-reasoning marker ({markers}) among the "
                    f"{len(tokens)} reported tokens, so the answer's G-NLL is unknown (scoring "
                    "them whole would score the trace); give the model's marker "
                    "(--reasoning marker:TEXT)"
                )
            else:
                return choice, None  # a format given, but this answer did not reason
    if not reasoning and split.source in ("marker", "token_ids"):
        # No reasoning parser: the text holds the trace too; the answer is what follows the marker.
        for f in formats:
            where = f.find(content)
            if where:
                content = content[where[1] :]
                break
        else:
            # Either the text is the answer alone (a framework dropped the trace's text but
            # kept its log-probs) or it ended inside the trace.
            if _aligned_text(pieces[split.answer_start :], content) is None:
                raise ReasoningError(
                    "the response's text ends inside the reasoning (its end-of-reasoning marker "
                    "is only among the tokens past the text): there is no answer to score"
                )
    answer_text = _aligned_text(pieces[split.answer_start :], content)
    if answer_text is None:
        raise ReasoningError(
            "the response's answer text does not match the tokens after the end-of-reasoning "
            f"marker (token {split.answer_start} of {len(tokens)}), so the answer's log-probs "
            "cannot be aligned with it; its G-NLL is unknown"
        )
    if reasoning and split.trace_text is None:
        split = replace(split, trace_text=reasoning)
    split = _with_tops(split, _tops(choice))
    return _slice_choice(choice, split.answer_start, answer_text), split


def _split_labels(
    labels: list[Label | None],
    values: Sequence[float | None],
    fmt: ReasoningFormat,
    pieces: Sequence[bytes],
) -> ReasoningSplit:
    """A split from per-token stream labels (``None``: the token came with an empty delta)."""
    n = len(labels)
    last_trace = max((i for i, lab in enumerate(labels) if lab == "trace"), default=-1)
    first_answer = next((i for i, lab in enumerate(labels) if lab == "answer"), n)
    if first_answer < last_trace:
        raise ReasoningError(
            f"the stream sent answer text (token {first_answer}) before the end of the reasoning "
            f"(token {last_trace}): its tokens cannot be split"
        )
    lo, hi = last_trace + 1, first_answer
    notes: tuple[str, ...] = ()
    if last_trace < 0 and hi == 0:
        # No trace token reported at all: the log-probs cover the answer only.
        return ReasoningSplit(0, 0, n, fmt.name, "answer-only", (), None)
    if hi > lo:  # unlabelled tokens between: the marker, maybe with parser-swallowed neighbours
        span = fmt.find_bytes(b"".join(pieces[lo:hi]))
        if span is not None:
            a, b = _bounds(pieces[lo:hi], span)
            lo, hi = lo + a, lo + b
    elif hi == n and lo == n:
        raise ReasoningError("the stream ended inside the reasoning: there is no answer to score")
    if hi > lo:
        hi = _past_white_space(pieces, hi)
    marker: tuple[float, ...] | None = _floats(values[lo:hi])
    if hi == lo:
        # llama.cpp sends no chunk for a token that adds no text, so the marker's log-prob never
        # reaches the client; neither would a swallowed white-space token at the answer's start.
        marker = None
        notes = (
            "the stream carried no token for the end-of-reasoning marker (llama.cpp streams drop "
            "tokens that add no text), so tokens between trace and answer may be missing",
        )
    return ReasoningSplit(lo, hi, n, fmt.name, "stream", _floats(values[:lo]), marker, notes)


class ReasoningStream:
    """Label a stream's tokens as they arrive: trace, marker or answer.

    Feed each chunk's choice (:meth:`add`). :attr:`past_marker` turns true when the first answer
    token arrives (a token after the end-of-reasoning marker and the white space after it);
    :attr:`answer_start` is its index and never changes after, so :attr:`answer_logprobs` (the
    answer's log-probs received so far) only grows: a running G-NLL over released answer tokens
    starts there. :meth:`split` gives the :class:`ReasoningSplit` when the stream ends.

    Examples
    --------
    >>> rs = ReasoningStream()
    >>> lp = lambda *ts: {"content": [{"token": t, "logprob": -0.5} for t in ts]}
    >>> rs.add({"delta": {"reasoning": "Hm"}, "logprobs": lp("Hm")}); rs.past_marker
    False
    >>> rs.add({"delta": {}, "logprobs": lp("</think>")}); rs.past_marker
    False
    >>> rs.add({"delta": {"content": "4"}, "logprobs": lp("4")}); rs.past_marker, rs.answer_start
    (True, 2)
    >>> rs.answer_logprobs
    [-0.5]
    >>> s = rs.split(); s.trace_tokens, s.marker_tokens, s.answer_tokens
    (1, 1, 1)
    """

    def __init__(self, fmt: ReasoningFormat | str = "think") -> None:
        self.fmt = reasoning_format(fmt)
        self.labels: list[Label | None] = []
        self.values: list[float | None] = []
        self.pieces: list[bytes] = []
        self.tops: list[tuple[float, ...]] = []
        self.answer_start: int | None = None
        self.reasoning = False

    @property
    def past_marker(self) -> bool:
        return self.answer_start is not None

    @property
    def answer_logprobs(self) -> list[float | None]:
        """The answer tokens' log-probs received so far (empty before :attr:`past_marker`)."""
        return [] if self.answer_start is None else self.values[self.answer_start :]

    def add(self, choice: dict[str, Any]) -> None:
        """One chunk's choice: its delta (or ``text``) and the tokens it carries."""
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        trace = reasoning_text(delta) or ""
        answer = (delta.get("content") if delta else choice.get("text")) or ""
        tokens, values, token_bytes = _entries(choice)
        pieces = _pieces(tokens, token_bytes)
        self.reasoning = self.reasoning or bool(trace)
        self.labels.extend(_chunk_labels(pieces, trace, answer))
        self.values.extend(values)
        self.pieces.extend(pieces)
        tops = _tops(choice)
        self.tops.extend(tops if len(tops) == len(tokens) else [()] * len(tokens))
        if self.answer_start is None:
            self._locate()

    def _locate(self) -> None:
        if "answer" in self.labels:
            start = self._answer_start()
            if start is not None and any(p.strip() for p in self.pieces[start:]):
                self.answer_start = start  # final: white space after the marker is the marker's
            return
        last_trace = max((i for i, lab in enumerate(self.labels) if lab == "trace"), default=-1)
        tail = b"".join(self.pieces[last_trace + 1 :])
        span = self.fmt.find_bytes(tail)
        if span is not None:
            a, b = _bounds(self.pieces[last_trace + 1 :], span)
            start = _past_white_space(self.pieces, last_trace + 1 + b)
            if start < len(self.pieces) and self.pieces[start].strip():
                self.answer_start = start

    def _answer_start(self) -> int | None:
        try:
            return _split_labels(list(self.labels), self.values, self.fmt, self.pieces).answer_start
        except ReasoningError:
            return None  # answer text before the trace ended: :meth:`split` says so

    def split(self) -> ReasoningSplit:
        split = _split_labels(list(self.labels), self.values, self.fmt, self.pieces)
        return _with_tops(split, self.tops)


def _chunk_labels(pieces: Sequence[bytes], trace: str, answer: str) -> list[Label | None]:
    """Labels of one chunk's tokens: the first ``len(trace)`` bytes are trace, the last
    ``len(answer)`` answer, anything between unlabelled (the marker, or an opening tag)."""
    total = sum(len(p) for p in pieces)
    t, a = len(trace.encode()), len(answer.encode())
    out: list[Label | None] = []
    pos = 0
    for p in pieces:
        start, end = pos, pos + len(p)
        pos = end
        if trace and end <= t:
            out.append("trace")
        elif answer and start >= total - a:
            out.append("answer")
        elif trace and not answer and start < t:
            out.append("trace")  # a token straddling the reported text's end (parser trimmed)
        elif answer and not trace and end > total - a:
            out.append("answer")
        else:
            out.append(None)
    return out


def responses_answer_choice(response: dict[str, Any]) -> tuple[dict[str, Any], ReasoningSplit]:
    """The Responses API's answer as a chat choice, from ``output_text`` ``logprobs``
    (``include: ["message.output_text.logprobs"]``): answer-aligned by construction, the trace's
    log-probs are not reported.

    Raises
    ------
    ReasoningError
        No ``output_text`` part with log-probs.

    Examples
    --------
    >>> r = {"output": [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hm"}]},
    ...     {"type": "message", "content": [{"type": "output_text", "text": "4",
    ...      "logprobs": [{"token": "4", "logprob": -0.2, "bytes": [52]}]}]}]}
    >>> c, s = responses_answer_choice(r)
    >>> c["message"]["content"], [e["logprob"] for e in c["logprobs"]["content"]], s.source
    ('4', [-0.2], 'responses')
    """
    texts: list[str] = []
    entries: list[dict[str, Any]] = []
    reasoned = False
    for item in response.get("output") or []:
        if not isinstance(item, dict):
            continue
        reasoned = reasoned or item.get("type") == "reasoning"
        if item.get("type") != "message":
            continue
        for part in item.get("content") or []:
            if isinstance(part, dict) and part.get("type") == "output_text":
                if not isinstance(part.get("logprobs"), list) or (
                    part.get("text") and not part["logprobs"]
                ):
                    raise ReasoningError(
                        "the Responses API answer carries no `output_text` log-probs (ask with "
                        'include: ["message.output_text.logprobs"]; llama.cpp always sends [])'
                    )
                texts.append(str(part.get("text") or ""))
                entries.extend(part["logprobs"])
    if not texts:
        raise ReasoningError("the Responses API answer has no `output_text` part")
    choice = {
        "message": {"role": "assistant", "content": "".join(texts)},
        "logprobs": {"content": entries},
        "finish_reason": "stop" if response.get("status") in (None, "completed") else "length",
    }
    n = len(entries)
    fmt = "responses" if reasoned else "none"
    return choice, ReasoningSplit(0, 0, n, fmt, "responses")
