"""Reasoning models behind an OpenAI-compatible server: where a response's (or a stream's) answer
starts, for every response shape (the format-neutral split is :mod:`gnll.backends.reasoning`).

* a whole response (:func:`split_choice`): vLLM / llama.cpp / sglang chat or completions choices,
  sliced at the marker in the reported tokens (or at the marker's token ids, when the server
  returned ``token_ids`` and the marker's ids are known);
* a stream (:class:`ReasoningStream`): each token labelled by the delta it came with
  (``reasoning`` / ``reasoning_content`` = trace, ``content`` = answer; a token that came with an
  empty delta sits between them: the marker, which vLLM sends as an empty-delta chunk and
  llama.cpp does not send at all, :attr:`ReasoningSplit.marker_reported`);
* the Responses API's ``output_text.logprobs`` (:func:`responses_choice`,
  :func:`responses_answer_choice`): the whole output on vLLM (split as chat's), the answer alone
  where a server reports only the answer's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gnll.backends.openai.parse import logprob_entries, logprob_shape, logprobs_from
from gnll.backends.reasoning import (
    HARMONY,
    THINK,
    Label,
    ReasoningError,
    ReasoningFormat,
    ReasoningSplit,
    past_white_space,
    reasoning_format,
    reported_floats,
    split_tokens,
    token_bounds,
    token_pieces,
)

__all__ = [
    "ReasoningStream",
    "reasoning_text",
    "responses_answer_choice",
    "responses_choice",
    "split_choice",
]


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
    entries = logprob_entries(choice.get("logprobs"))
    tokens = [str(e.get("token", "")) for e in entries]
    values = [e.get("logprob") for e in entries]
    bl = [e.get("bytes") for e in entries]
    return tokens, values, (bl if bl and all(isinstance(b, list) for b in bl) else None)


def _tops(choice: dict[str, Any]) -> list[tuple[float, ...]]:
    """The reported alternatives' log-probs at each position (either shape; empty if none)."""
    return [
        tuple(
            float(a["logprob"])
            for a in e.get("top_logprobs") or []
            if isinstance(a, dict) and a.get("logprob") is not None
        )
        for e in logprob_entries(choice.get("logprobs"))
    ]


def _with_tops(split: ReasoningSplit, tops: Sequence[tuple[float, ...]]) -> ReasoningSplit:
    if len(tops) < split.trace_end or not all(tops[: split.trace_end]):
        return split
    return replace(split, trace_top_logprobs=tuple(tops[: split.trace_end]))


def _slice_choice(choice: dict[str, Any], start: int, answer_text: str | None) -> dict[str, Any]:
    """``choice`` with its log-probs (and ``token_ids``) from token ``start`` on."""
    out = dict(choice)
    # (a legacy shape's text offsets point into the whole text; the answer has its own)
    out["logprobs"] = logprobs_from(choice["logprobs"], start)
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
    pieces = token_pieces(tokens, token_bytes)
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
            a, b = token_bounds(pieces[lo:hi], span)
            lo, hi = lo + a, lo + b
    elif hi == n and lo == n:
        raise ReasoningError("the stream ended inside the reasoning: there is no answer to score")
    if hi > lo:
        hi = past_white_space(pieces, hi)
    marker: tuple[float, ...] | None = reported_floats(values[lo:hi])
    if hi == lo:
        # llama.cpp sends no chunk for a token that adds no text, so the marker's log-prob never
        # reaches the client; neither would a swallowed white-space token at the answer's start.
        marker = None
        notes = (
            "the stream carried no token for the end-of-reasoning marker (llama.cpp streams drop "
            "tokens that add no text), so tokens between trace and answer may be missing",
        )
    return ReasoningSplit(
        lo, hi, n, fmt.name, "stream", reported_floats(values[:lo]), marker, notes
    )


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
        pieces = token_pieces(tokens, token_bytes)
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
            a, b = token_bounds(self.pieces[last_trace + 1 :], span)
            start = past_white_space(self.pieces, last_trace + 1 + b)
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


def responses_choice(response: dict[str, Any]) -> dict[str, Any]:
    """A Responses API body as the chat choice it answers: the ``output_text`` parts' text and
    ``logprobs`` (``include: ["message.output_text.logprobs"]``), the ``reasoning`` items' text,
    ``finish_reason`` ``length`` when cut at ``max_output_tokens``.

    Which tokens the log-probs cover depends on the server: OpenAI's describe the answer only,
    vLLM's (0.32, with a reasoning parser) the whole output, trace and marker included, as on its
    chat route. The trace goes into ``message.reasoning``, so that :func:`split_choice` reads the
    choice as a chat choice's: split at the marker, or taken as the answer's alone when the tokens
    spell the answer text (``answer-only``). A body without ``output_text`` parts has
    ``logprobs: None``.

    Examples
    --------
    >>> r = {"output": [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hm"}]},
    ...     {"type": "message", "content": [{"type": "output_text", "text": "4",
    ...      "logprobs": [{"token": "4", "logprob": -0.2, "bytes": [52]}]}]}]}
    >>> c = responses_choice(r)
    >>> c["message"], c["finish_reason"]
    ({'role': 'assistant', 'content': '4', 'reasoning': 'hm'}, 'stop')
    """
    texts: list[str] = []
    entries: list[dict[str, Any]] = []
    trace: list[str] = []
    asked = False
    for item in response.get("output") or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "reasoning":
            trace.extend(
                str(p.get("text") or "") for p in item.get("content") or [] if isinstance(p, dict)
            )
        if item.get("type") != "message":
            continue
        for part in item.get("content") or []:
            if isinstance(part, dict) and part.get("type") == "output_text":
                texts.append(str(part.get("text") or ""))
                asked = asked or isinstance(part.get("logprobs"), list)
                entries.extend(part.get("logprobs") or [])
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if "".join(trace).strip():
        message["reasoning"] = "".join(trace)
    cut = (response.get("incomplete_details") or {}).get("reason") == "max_output_tokens"
    return {
        "index": 0,
        "message": message,
        "logprobs": {"content": entries} if asked else None,
        "finish_reason": "length" if cut or response.get("status") == "incomplete" else "stop",
        # vLLM names no stop string in a Responses body: its answer ended at EOS or the limit
        "stop_reason": None,
    }


def responses_answer_choice(response: dict[str, Any]) -> tuple[dict[str, Any], ReasoningSplit]:
    """The Responses API's answer as a chat choice with the answer's log-probs only
    (:func:`responses_choice`, split at the marker when the log-probs cover the trace too).

    Raises
    ------
    ReasoningError
        No ``output_text`` part with log-probs, or log-probs that cover a trace they cannot be
        aligned with.

    Examples
    --------
    >>> r = {"output": [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hm"}]},
    ...     {"type": "message", "content": [{"type": "output_text", "text": "4",
    ...      "logprobs": [{"token": "4", "logprob": -0.2, "bytes": [52]}]}]}]}
    >>> c, s = responses_answer_choice(r)
    >>> c["message"]["content"], [e["logprob"] for e in c["logprobs"]["content"]], s.source
    ('4', [-0.2], 'responses')
    """
    choice = responses_choice(response)
    has_text = any(
        isinstance(item, dict)
        and item.get("type") == "message"
        and any(
            isinstance(p, dict) and p.get("type") == "output_text"
            for p in item.get("content") or []
        )
        for item in response.get("output") or []
    )
    if not has_text:
        raise ReasoningError("the Responses API answer has no `output_text` part")
    lp = choice.get("logprobs")
    entries = logprob_entries(lp) if logprob_shape(lp) == "content" else None
    if entries is None or (choice["message"]["content"] and not entries):
        raise ReasoningError(
            "the Responses API answer carries no `output_text` log-probs (ask with "
            'include: ["message.output_text.logprobs"]; llama.cpp always sends [])'
        )
    if "reasoning" not in choice["message"]:
        return choice, ReasoningSplit(0, 0, len(entries), "none", "responses")
    # split as a chat choice's: at the marker (vLLM: the whole output), or answer-only
    answer, split = split_choice(choice)
    assert split is not None  # it carries reasoning
    answer["message"] = {k: v for k, v in answer["message"].items() if k != "reasoning"}
    if split.source == "answer-only":
        split = ReasoningSplit(0, 0, len(entries), "responses", "responses")
    return answer, split
