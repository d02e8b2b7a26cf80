"""Tool calls and structured outputs through the proxy (``gnll serve --upstream``).

The request goes upstream as the client sent it (``tools``, ``tool_choice``,
``parallel_tool_calls``, ``response_format``), with log-probs on: the upstream renders the tools
with its chat template, decodes (under its grammar, where it constrains), and its tool parser
takes the calls out of the text (vLLM: ``--enable-auto-tool-choice --tool-call-parser``). Its
``logprobs.content`` still carries every token the model wrote, the calls' included, so each call
is found in that output (:func:`gnll.policy.choices.tool_choice_answer`) and gets the same record
as in-process (:func:`gnll.toolcalls.call_report`: the call's G-NLL, its name's NLL, each argument
value's NLL over its own tokens, the tokens each part scored), and the same gate decides it
(:func:`gnll.policy.tools.decide_tool_answer`): a withheld call never reaches the client (under
``refuse`` the upstream is asked without streaming and a stream is a replay of the decided body).

**Early decisions.** Under ``refuse`` and ``escalate``, with early decisions on
(:meth:`~gnll.serving.settings.ServeSettings.proxy_decides_early`), a greedy request for one
answer with tools is streamed from the upstream and each token it releases goes to the rule of
:meth:`ProxyTools.early_rule` (:class:`gnll.toolwatch.ToolCallDecision`, as in-process): it reads
the calls in gnll's documented format (``<tool_call>`` blocks: vLLM's ``hermes`` parser) and
decides at the token where a call's running G-NLL, or one argument value's running NLL, crosses
its threshold; the proxy then closes the connection (the upstream stops generating) and the call
is withheld. Every finished output is read by the same watch (:meth:`ProxyTools.decide`), so a
call is decided alike whether the stream was cut at its decision or read to its end; an output in
another format is never decided by the watch, and the end-of-output gate decides it.

An answer without calls is an ordinary answer. A JSON ``response_format`` answer is an ordinary
answer too, with ``uncertainty.structured``: each field's NLL from the upstream's log-probs and
which distribution they are (``raw`` on vLLM's default log-probs mode, ``unknown`` where gnll has
not established it: :attr:`gnll.backends.openai.servers.ServerProfile.structured_logprobs`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from gnll.policy import Answer, annotate
from gnll.policy.choices import tool_choice_answer
from gnll.policy.tools import decide_tool_answer
from gnll.serving.errors import HTTPError
from gnll.serving.protocol.chat import CHAT
from gnll.serving.protocol.tools import ResponseFormat, ToolRequest
from gnll.serving.tools import call_rule
from gnll.toolcalls import ParsedCall, parse_output

if TYPE_CHECKING:
    from gnll.backends.base import GenerationConfig
    from gnll.backends.openai.servers import ServerProfile
    from gnll.serving.responses import Mark
    from gnll.serving.schemas import ChatCompletionRequest, CompletionRequest
    from gnll.serving.settings import ServeSettings
    from gnll.toolwatch import CallWatch, ToolCallDecision
    from gnll.uncertainty import Uncertainty

__all__ = ["Decided", "ProxyTools", "refusal_named"]

#: The chat template renders the messages (the tool prompt included): the policy's prompt format.
_FORMAT = "chat"


@dataclass
class Decided:
    """One upstream choice decided: the answer scored, its record, and what the client gets."""

    answer: Answer
    record: Uncertainty
    text: str | None
    finish: str | None
    #: The assistant message that replaces the upstream's (a withheld call's), else ``None``.
    message: dict[str, Any] | None = None


@dataclass(frozen=True)
class ProxyTools:
    """What a chat request asks of tools or of a JSON format, as the proxy reads its answers."""

    tools: ToolRequest | None
    fmt: ResponseFormat | None

    @classmethod
    def of(cls, req: CompletionRequest | ChatCompletionRequest) -> ProxyTools | None:
        """The request's tools / JSON format (``None``: an ordinary request). The typed check
        is the in-process one; what the upstream cannot serve, it refuses itself."""
        if req.shape is not CHAT:  # tools and JSON formats are chat completions' own
            return None
        extra = req.model_extra or {}
        tools, fmt = ToolRequest.of(extra), ResponseFormat.of(extra)
        return None if tools is None and fmt is None else cls(tools, fmt)

    @property
    def grammar(self) -> bool:
        """Whether the upstream decodes the answer under its grammar: a JSON format, a required
        or named call, or (vLLM) the call of a ``strict`` tool."""
        if self.fmt is not None:
            return True
        assert self.tools is not None
        return self.tools.required or any(t.function.strict for t in self.tools.tools)

    def logprobs(self, profile: ServerProfile) -> str:
        """Which distribution the upstream's log-probs of this answer are."""
        return profile.structured_logprobs if self.grammar else "raw"

    def early_rule(self, settings: ServeSettings) -> ToolCallDecision | None:
        """The exact early decision on the calls of one streamed answer (``None``: no tools, or a
        policy that withholds no call or cannot decide before the end)."""
        make = call_rule(settings, self.tools, _FORMAT) if self.tools is not None else None
        return make() if make is not None else None

    def describe(self) -> str:
        """What the request asked, for an upstream's refusal of it."""
        if self.tools is not None:
            choice = self.tools.tool_choice
            named = choice if isinstance(choice, str) else f"function {choice.function.name}"
            return f"tools (tool_choice {named})"
        assert self.fmt is not None
        return f"response_format {self.fmt.type}"

    def decide(
        self,
        choice: dict[str, Any],
        ordinary: Callable[[], Answer],
        req: ChatCompletionRequest,
        settings: ServeSettings,
        profile: ServerProfile,
        config: GenerationConfig,
        where: str,
    ) -> Decided:
        """Score and decide one upstream choice. ``ordinary``: reads the choice as a free-text
        answer (what a choice without calls is; for an answer cut at its early decision, that
        answer)."""
        message: dict[str, Any] = (
            choice["message"] if isinstance(choice.get("message"), dict) else {}
        )
        if self.tools is not None and message.get("tool_calls"):
            answer, calls = tool_choice_answer(
                choice,
                config,
                eos_logprob=profile.eos_logprob,
                decoding="greedy" if req.greedy else "sampled",
                where=where,
            )
            return self._calls(choice, answer, calls, req, settings, profile)
        answer = ordinary()
        watch = self._watch(answer, settings)
        if watch is not None and watch.decided:
            # A call attempt the upstream's parser did not return (the stream was cut at its
            # decision, or the model broke it off): withheld from the watch's record, as
            # in-process, so that stopping early and reading to the end decide alike.
            assert self.tools is not None
            parsed = parse_output(answer.text, self.tools.names)
            calls = parsed.calls if self.tools.parallel_tool_calls else parsed.calls[:1]
            return self._calls(
                choice, answer, calls, req, settings, profile, watch, parsed.content, parsed.error
            )
        if answer.early is not None:
            raise AssertionError(
                f"{where}: an answer cut at a call's decision that no call decides"
            )
        [record], [text], [finish] = annotate(
            [answer],
            settings.policy,
            include_tokens=req.wants_logprobs,
            source="upstream",
            prompt_format=_FORMAT,
        )
        if self.fmt is not None:
            record = record.model_copy(update={"structured": self._structured(record, profile)})
        return Decided(answer, record, text, finish)

    def decide_all(
        self,
        choices: list[dict[str, Any]],
        read: Callable[[dict[str, Any], int], Answer],
        req: CompletionRequest | ChatCompletionRequest,
        settings: ServeSettings,
        profile: ServerProfile,
        config: GenerationConfig,
        mark: Mark | None,
        model: str | None,
    ) -> tuple[list[Answer], list[Uncertainty]]:
        """Decide an upstream's choices (per call, where it returned calls) and put the records
        on them, ``mark``ed (an escalation's) as they are sent. ``read`` reads a choice as a
        free-text answer."""
        chat = cast("ChatCompletionRequest", req)  # only a chat request has tools (``of``)
        decisions = [
            self.decide(
                c,
                lambda c=c, i=i: read(c, i),  # type: ignore[misc]
                chat,
                settings,
                profile,
                config,
                f"choice {i}",
            )
            for i, c in enumerate(choices)
        ]
        records = [d.record for d in decisions]
        if mark is not None:
            records = mark(records, model)
        for choice, d, rec in zip(choices, decisions, records, strict=True):
            d.record = rec
            apply(choice, d, keep_logprobs=chat.wants_logprobs)
        return [d.answer for d in decisions], records

    def _structured(self, record: Uncertainty, profile: ServerProfile) -> dict[str, Any]:
        assert self.fmt is not None
        out: dict[str, Any] = {"type": self.fmt.type, "logprobs": self.logprobs(profile)}
        if record.spans is not None and record.spans_kind == "json" and not record.refused:
            out["fields"] = [{"path": s.path, "nll": s.nll} for s in record.spans]
        return out

    def _watch(self, answer: Answer, settings: ServeSettings) -> CallWatch | None:
        """The early decision's watch over a finished output (``None``: no such rule)."""
        rule = self.early_rule(settings)
        return rule.watch.read(answer.tokens, answer.token_logprobs) if rule is not None else None

    def _calls(
        self,
        choice: dict[str, Any],
        answer: Answer,
        calls: Sequence[ParsedCall],
        req: ChatCompletionRequest,
        settings: ServeSettings,
        profile: ServerProfile,
        watch: CallWatch | None = None,
        content: str = "",
        error: str | None = None,
    ) -> Decided:
        """``answer`` with ``calls`` decided: by the gate, and by ``watch`` (read over ``answer``
        when not given): a call it decided on is withheld, complete or not."""
        if watch is None:
            watch = self._watch(answer, settings)
        decided = decide_tool_answer(
            answer,
            calls,
            settings.policy,
            content=content,
            error=error,
            argument_threshold=settings.tool_argument_threshold,
            prompt_format=_FORMAT,
            include_tokens=req.wants_logprobs,
            source="upstream",
            watch=watch,
        )
        record = self._which(decided.record, profile)
        if decided.withheld:  # nothing of the calls goes out: the policy's message instead
            message = {"role": "assistant", "content": decided.text, "refusal": None}
            return Decided(answer, record, decided.text, decided.finish_reason, message)
        upstream = choice["message"]["tool_calls"]
        calls_sent = [
            {**c, "id": sent["id"]} if isinstance(sent, dict) and sent.get("id") else c
            for c, sent in zip(decided.calls, upstream, strict=True)
        ]  # the record names the calls the client gets
        record = record.model_copy(update={"tool_calls": calls_sent})
        return Decided(answer, record, None, choice.get("finish_reason"))

    def _which(self, record: Uncertainty, profile: ServerProfile) -> Uncertainty:
        """The record saying which distribution its numbers are (the upstream's grammar)."""
        return record.model_copy(
            update={"structured": {"type": "tool_calls", "logprobs": self.logprobs(profile)}}
        )


def apply(choice: dict[str, Any], decided: Decided, *, keep_logprobs: bool) -> None:
    """Put a decided choice's record, text and finish reason on the upstream's ``choice``."""
    choice["uncertainty"] = decided.record.to_json()
    choice["finish_reason"] = decided.finish
    if decided.message is not None:  # withheld: nothing of the call goes out
        choice["message"] = decided.message
    elif decided.text is not None and isinstance(choice.get("message"), dict):
        choice["message"]["content"] = decided.text
    if not keep_logprobs or decided.record.refused:
        choice["logprobs"] = None


@contextlib.contextmanager
def refusal_named(special: ProxyTools, profile: ServerProfile) -> Iterator[None]:
    """An upstream's error answer to a request with tools or a JSON format says which server
    refused what, its own message kept (vLLM started without auto tool choice, a llama.cpp
    server without a tool-aware template): the upstream's error, named, not gnll's."""
    try:
        yield
    except HTTPError as exc:
        if exc.type != "upstream_timeout" and not exc.message.startswith("cannot reach"):
            exc.message = f"the upstream {profile.name} server refused {special.describe()}: " + (
                exc.message
            )
            exc.args = (exc.message,)
        raise
