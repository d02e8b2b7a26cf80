"""What every framework integration shares: a framework's log-probs in, ``gnll serve``'s record out.

A framework hands over the answer's text and the OpenAI ``logprobs`` object it kept (chat
``{"content": [{token, logprob, bytes, top_logprobs}, ...]}`` or legacy completions ``{tokens,
token_logprobs, ...}``). :class:`AnswerScorer` turns them into the choice ``gnll serve --upstream``
would have received and scores it with the proxy's own functions, so the numbers are those of the
server for the same answer: the answer/terminator split of the server backend's parser
(``server``: whether the server reports the end-of-sequence token), G-NLL from
:mod:`gnll.measures`, spans from :mod:`gnll.spans`, ``p_correct`` and the decision from an
:class:`~gnll.serving.AbstentionPolicy`.

Examples
--------
>>> scorer = AnswerScorer(policy=make_policy("flag", threshold=1.0))
>>> scored = scorer.score(" Paris.", {"content": [
...     {"token": " Paris", "logprob": -0.25}, {"token": ".", "logprob": -0.5}]})
>>> round(scored.uncertainty.g_nll, 2), scored.uncertainty.abstain, scored.text
(0.75, False, ' Paris.')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gnll._util.validation import ParameterError
from gnll.backends.base import GenerationConfig
from gnll.backends.openai.parse import logprob_entries, logprob_shape
from gnll.backends.openai.servers import PROFILES
from gnll.measures.logprobs import LogprobError
from gnll.policy import AbstentionPolicy, Answer, annotate, headers_for
from gnll.policy.choices import choice_answer
from gnll.policy.tools import decide_tool_answer
from gnll.toolcalls import locate_calls
from gnll.uncertainty import Uncertainty

__all__ = [
    "AnswerScorer",
    "ReasoningTokensError",
    "Scored",
    "decoding_of",
    "headers_for",
    "make_policy",
    "observing_policy",
    "tool_call_pairs",
]

_UNSET = object()


class ReasoningTokensError(LogprobError):
    """The log-probs cover tokens before the answer's text: a reasoning model's trace whose text
    the framework dropped (LangChain keeps the trace's log-probs in ``response_metadata`` but not
    its text), so the answer's own tokens cannot be told apart."""


def make_policy(
    policy: AbstentionPolicy | str = "annotate",
    *,
    calibration: str | Path | None = None,
    threshold: float | None = None,
    min_p_correct: float | None = None,
    rule: str | None = None,
    refusal: str | None = None,
    model: str | None = None,
    escalate: bool = False,
) -> AbstentionPolicy:
    """An :class:`~gnll.policy.AbstentionPolicy` from ``gnll serve``'s options.

    ``policy``: ``"annotate"``, ``"flag"`` or ``"refuse"`` (or a ready policy, returned as is);
    ``calibration``: a ``gnll calibrate`` file, or ``"auto"`` with an embedded ``model``'s name;
    ``threshold``: abstain when G-NLL is above it (without a calibration); ``escalate``: the
    integration has a larger model to ask, so ``"escalate"`` is accepted (the LiteLLM proxy's).

    >>> make_policy("refuse", threshold=3.0).describe()["source"]
    'threshold: abstain when G-NLL > 3'
    """
    if isinstance(policy, AbstentionPolicy):
        return policy
    if policy == "escalate" and not escalate:
        raise ValueError(
            "policy 'escalate' needs a second model: put `gnll serve --policy escalate` in front of "
            "the model instead (this integration annotates, flags or refuses; the LiteLLM proxy escalates "
            "to its GNLL_ESCALATE_MODEL)"
        )
    kwargs: dict[str, Any] = {"mode": policy, "min_p_correct": min_p_correct, "rule": rule}
    if refusal is not None:
        kwargs["refusal"] = refusal
    # The policy checks itself: a rule when it must decide, and not one that refuses everything.
    if calibration is not None:
        return AbstentionPolicy.from_calibration(calibration, model=model, **kwargs)
    return AbstentionPolicy(threshold=threshold, **kwargs)


def observing_policy(
    policy: AbstentionPolicy | str = "annotate", **options: Any
) -> AbstentionPolicy:
    """:func:`make_policy` for a callback or event handler, which only observes: it sees an answer
    after the caller got it, so it cannot withhold it (``refuse``, ``escalate``: use the framework's
    ``with_uncertainty`` wrapper, which holds the answer until it is decided)."""
    out = make_policy(policy, **options)
    if out.withholds:
        raise ParameterError(
            "policy",
            f"{out.mode!r}: a callback only observes (it sees each answer after the caller does); "
            "use with_uncertainty(...) to withhold answers",
        )
    return out


def decoding_of(temperature: float | None) -> str:
    """``"greedy"`` for temperature 0 or unset (the integrations pin 0), else ``"sampled"``."""
    return "greedy" if not temperature else "sampled"


@dataclass(frozen=True)
class Scored:
    """One scored answer: its record, and the text and finish reason a caller sees under the
    policy (the refusal when ``refuse`` abstained)."""

    uncertainty: Uncertainty
    text: str
    finish_reason: str | None

    @property
    def refused(self) -> bool:
        return bool(self.uncertainty.refused)


@dataclass
class AnswerScorer:
    """Score answers from the log-probs a framework kept, as ``gnll serve --upstream`` would.

    Parameters
    ----------
    policy:
        What to do with likely wrong answers (:func:`make_policy`).
    server:
        The server behind the framework, a profile of :data:`gnll.backends.openai.servers.PROFILES`
        (``"vllm"``, ``"llama.cpp"``, ``"gnll"``, ...; ``"generic"`` by default): it says whether
        the server reports the end-of-sequence token's log-prob, which is then not part of the
        answer.
    stop:
        The request's stop strings (the token that produced one is not part of the answer).
    prompt_format:
        How the prompt was rendered (``"chat"`` for chat models): a calibration fitted on another
        format gives no ``p_correct``.
    include_tokens:
        Put the answer's tokens and log-probs into the record.
    tool_argument_threshold:
        Also withhold a tool call (under ``refuse``) when one of its argument values' NLL is above
        this, as ``gnll serve --tool_argument_threshold``.
    """

    policy: AbstentionPolicy = field(default_factory=AbstentionPolicy)
    server: str = "generic"
    stop: Sequence[str] = ()
    prompt_format: str | None = "chat"
    include_tokens: bool = False
    tool_argument_threshold: float | None = None

    def __post_init__(self) -> None:
        if self.server not in PROFILES:
            raise ValueError(
                f"unknown server {self.server!r}: one of {', '.join(sorted(PROFILES))}"
            )
        if isinstance(self.stop, str):
            self.stop = (self.stop,)

    def score(
        self,
        text: str | None,
        logprobs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
        *,
        finish_reason: str | None = None,
        stop_reason: Any = _UNSET,
        decoding: str = "greedy",
        stop: Sequence[str] | None = None,
        where: str = "response",
        tool_calls: Sequence[Any] | None = None,
    ) -> Scored:
        """The record of one answer: ``text`` as the model returned it, ``logprobs`` the OpenAI
        ``logprobs`` object (or its ``content`` list); ``stop_reason`` as vLLM reports it, when the
        framework kept it.

        ``tool_calls``: the calls the message carries (OpenAI ``tool_calls`` entries, or
        ``{"name", "arguments"}``; :func:`tool_call_pairs`). Their tokens are in the log-probs
        (servers put the whole output there); each call is found in it as the proxy finds it
        (:func:`gnll.toolcalls.locate_calls`) and gets its record in ``uncertainty.tool_calls`` and the policy decides each call as
        ``gnll serve`` does (:func:`gnll.policy.tools.decide_tool_answer`). A withheld call makes
        the answer ``refused``: the caller must drop the message's calls and show ``text``.
        """
        answer = self.answer(
            text,
            logprobs,
            finish_reason=finish_reason,
            stop_reason=stop_reason,
            decoding=decoding,
            stop=stop,
            where=where,
            spelled=bool(tool_calls),
        )
        pairs = tool_call_pairs(tool_calls)
        if pairs:
            try:  # where the server's parser found each call in the output (as the proxy does)
                calls = list(locate_calls(answer.text, pairs))
            except ValueError as exc:
                raise LogprobError(f"{where}: {exc}") from None
            out = decide_tool_answer(
                answer,
                calls,
                self.policy,
                content="" if text is None else str(text),
                argument_threshold=self.tool_argument_threshold,
                prompt_format=self.prompt_format,
                include_tokens=self.include_tokens,
                source=where,
            )
            return Scored(out.record, out.text, out.finish_reason)
        records, texts, finishes = annotate(
            [answer],
            self.policy,
            include_tokens=self.include_tokens,
            source=where,
            prompt_format=self.prompt_format,
        )
        return Scored(records[0], texts[0], finishes[0])

    def answer(
        self,
        text: str | None,
        logprobs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
        *,
        finish_reason: str | None = None,
        stop_reason: Any = _UNSET,
        decoding: str = "greedy",
        stop: Sequence[str] | None = None,
        where: str = "response",
        spelled: bool = False,
    ) -> Answer:
        """The :class:`~gnll.policy.Answer` the policy decides on (what :meth:`score` scores):
        its answer tokens and their log-probs, the terminator split off. ``spelled``: the output
        is the text the log-probs spell (``text`` only its beginning: a message whose tool calls
        are not in its text)."""
        if logprobs is None:
            raise LogprobError(
                f"{where} carries no log-probs: ask the model for them (`logprobs=True, "
                "top_logprobs=1`), and use a server that returns them (`gnll doctor URL`)",
                kind="missing",
            )
        lp = {"content": list(logprobs)} if isinstance(logprobs, Sequence) else dict(logprobs)
        text = "" if text is None else str(text)
        if spelled:
            # the message's text holds none of the calls; the output is what the tokens spell
            whole = _spelled(lp)
            if whole is None or not whole.startswith(text):
                raise LogprobError(
                    f"{where}: its log-probs do not spell its text and tool calls (they spell "
                    f"{(whole or '')[:60]!r})"
                )
            text = whole
        reasoning = None
        try:
            _check_no_trace(text, lp, where)
        except ReasoningTokensError:
            # The framework dropped the trace's text but the log-probs still hold its
            # end-of-reasoning marker: the answer is what follows it.
            reasoning = _marker_format(lp)
            if reasoning is None:
                raise
        choice: dict[str, Any] = {
            "message": {"role": "assistant", "content": text},
            "logprobs": lp,
            "finish_reason": finish_reason,
        }
        if stop_reason is not _UNSET:
            choice["stop_reason"] = stop_reason
        stops = tuple(self.stop if stop is None else ([stop] if isinstance(stop, str) else stop))
        return choice_answer(
            choice,
            GenerationConfig(stop=stops),
            eos_logprob=PROFILES[self.server].eos_logprob,
            decoding=decoding,
            where=where,
            reasoning=reasoning,
        )


def tool_call_pairs(tool_calls: Sequence[Any] | None) -> list[tuple[str, Any]]:
    """``(name, arguments)`` of each call a message carries: OpenAI ``tool_calls`` entries
    (``{"function": {"name", "arguments"}}``, objects too) or ``{"name", "arguments"}`` (the
    arguments a JSON string or an object)."""

    def get(obj: Any, key: str) -> Any:
        return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)

    out = []
    for call in tool_calls or []:
        fn = get(call, "function") or call
        out.append((str(get(fn, "name")), get(fn, "arguments") or {}))
    return out


def _spelled(logprobs: Mapping[str, Any]) -> str | None:
    """The text the log-prob entries spell (their bytes where every entry has them)."""
    if logprob_shape(logprobs) is None:
        return None
    entries = [e for e in logprob_entries(logprobs) if isinstance(e, Mapping)]
    byte_lists = [e.get("bytes") for e in entries]
    if byte_lists and all(isinstance(b, list) for b in byte_lists):
        return bytes(x for b in byte_lists for x in b).decode("utf-8", errors="replace")
    return "".join(str(e.get("token", "")) for e in entries)


def _marker_format(logprobs: dict[str, Any]) -> str | None:
    """The reasoning format whose end-of-reasoning marker is among the tokens (``None``: none)."""
    from gnll.backends.reasoning import FORMATS, ReasoningError, split_tokens

    entries = logprob_entries(logprobs)
    tokens = [str(e.get("token", "")) for e in entries if isinstance(e, Mapping)]
    for name, fmt in FORMATS.items():
        try:
            split_tokens(tokens, fmt)
        except ReasoningError:
            continue
        return name
    return None


def _check_no_trace(text: str, logprobs: dict[str, Any], where: str) -> None:
    """A :class:`ReasoningTokensError` when the tokens spell more than the text *before* it."""
    if logprob_shape(logprobs) is None:
        return  # the parser says "no log-probs" in its own words
    entries = [e for e in logprob_entries(logprobs) if isinstance(e, Mapping)]
    tokens = [str(e.get("token", "")) for e in entries]
    byte_lists = [e.get("bytes") for e in entries]
    if byte_lists and all(isinstance(b, list) for b in byte_lists):
        spelled = bytes(x for b in byte_lists for x in b).decode("utf-8", errors="replace")
    elif any(t == "" for t in tokens):
        return  # split multi-byte characters: the strings do not spell the text (parse.py)
    else:
        spelled = "".join(tokens)
    if not text or spelled.startswith(text):
        return
    at = spelled.find(text)
    if at > 0:
        raise ReasoningTokensError(
            f"{where}: its {len(tokens)} log-probs spell {at} characters before the answer's text "
            "(a reasoning model's trace, whose text the framework dropped): the answer's own "
            "tokens cannot be told apart. Turn the model's thinking off, or put `gnll serve "
            "--upstream` in front of the server (it sees the trace and the answer apart)"
        )
    raise LogprobError(
        f"{where}: its log-probs do not spell the answer's text (they spell "
        f"{spelled[:60]!r}, the text is {text[:60]!r}): they belong to another answer"
    )
