"""LlamaIndex: G-NLL on chat and completion responses (``pip install "gnll[llamaindex]"``).

LlamaIndex's own ``ChatResponse.logprobs`` keeps each position's *alternatives* only, and drops a
position whose ``top_logprobs`` list is empty (``from_openai_token_logprobs``), so a model asked for
``logprobs`` without ``top_logprobs`` silently loses tokens, and the sampled token's own log-prob is
not a field. gnll therefore reads the server's response that LlamaIndex keeps in ``response.raw``
(every position, with its own log-prob, and vLLM's ``stop_reason``), and asks for
``top_logprobs >= 1`` anyway.

- :func:`with_uncertainty` wraps an OpenAI-compatible LLM (``OpenAILike``, ``OpenAI``): log-probs
  on, temperature 0, and ``response.additional_kwargs["uncertainty"]`` on every ``chat``,
  ``complete``, ``stream_chat`` and ``stream_complete`` (on their last response) and their async
  forms. Under ``policy="refuse"`` a stream is held until its answer is decided
  (:meth:`gnll.policy.AbstentionPolicy.wrap`): a refused answer's text never reaches the caller,
  only the refusal.
- Function calling: ``chat_with_tools``, ``predict_and_call`` (and their async and streaming
  forms) of a function-calling LLM (``OpenAILike(..., is_function_calling_model=True)``) go through
  the wrapper: ``additional_kwargs["uncertainty"]["tool_calls"]`` has each call's record (its
  ``g_nll``, ``name_nll``, per-argument NLLs, ``least_certain_argument``, ``withheld``). Under
  ``refuse`` a withheld call is taken out of the message (no ``ToolCallBlock``, no
  ``tool_calls``): ``predict_and_call`` runs no tool and answers with the message saying which
  call was withheld.
- :class:`UncertaintyEventHandler` is an instrumentation handler (``get_dispatcher().add_event_handler``)
  that scores every ``LLMChatEndEvent`` / ``LLMCompletionEndEvent`` it sees (streams included) and
  puts the same record on the response.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from llama_index.core.base.llms.types import TextBlock
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import (
    LLMChatEndEvent,
    LLMChatInProgressEvent,
    LLMCompletionEndEvent,
    LLMCompletionInProgressEvent,
)

from gnll.backends.openai.parse import logprob_entries
from gnll.integrations.core import AnswerScorer, Scored, make_policy, observing_policy
from gnll.policy import AbstentionPolicy
from gnll.uncertainty import Uncertainty

__all__ = ["UncertaintyEventHandler", "UncertaintyLLM", "with_uncertainty"]

_UNSET = object()


def _dump(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    return dump() if dump is not None else obj


def _raw_choice(response: Any) -> dict[str, Any] | None:
    raw = _dump(getattr(response, "raw", None))
    if not isinstance(raw, dict) or not raw.get("choices"):
        return None
    choice = raw["choices"][0]
    return choice if isinstance(choice, dict) else None


def _chunk_entries(response: Any) -> list[dict[str, Any]]:
    """The log-prob entries of one streamed chunk (``response.raw`` of a streamed response), in
    the chat shape (a completions chunk's ``tokens``/``token_logprobs`` become entries)."""
    choice = _raw_choice(response)
    return logprob_entries((choice or {}).get("logprobs"))


def _tool_calls(response: Any, choice: dict[str, Any]) -> list[Any] | None:
    """The calls a response carries: the server's own (``raw``), else the message's
    ``ToolCallBlock`` blocks or ``additional_kwargs["tool_calls"]`` (a stream's last response)."""
    raw = (choice.get("message") or {}).get("tool_calls") if "delta" not in choice else None
    if raw:
        return list(raw)
    message = getattr(response, "message", None)
    if message is None:
        return None
    blocks = [
        b for b in getattr(message, "blocks", []) if getattr(b, "block_type", "") == "tool_call"
    ]
    if blocks:
        return [{"name": b.tool_name, "arguments": b.tool_kwargs} for b in blocks]
    return message.additional_kwargs.get("tool_calls") or None


class _Scoring:
    """Score a LlamaIndex response from ``response.raw`` (and a stream's accumulated entries)."""

    scorer: AnswerScorer

    def _score(self, response: Any, streamed: list[dict[str, Any]] | None = None) -> Scored:
        choice = _raw_choice(response)
        if choice is None:
            raise ValueError(
                "the LlamaIndex response keeps no raw server response (`response.raw`): gnll "
                "cannot read every token's log-prob from ChatResponse.logprobs (it keeps the "
                "alternatives only, and drops positions without any)"
            )
        message = getattr(response, "message", None)
        text = message.content if message is not None else getattr(response, "text", "")
        stream = "delta" in choice or streamed is not None
        logprobs = {"content": streamed or []} if stream else choice.get("logprobs")
        kwargs: dict[str, Any] = {}
        if "stop_reason" in choice:
            kwargs["stop_reason"] = choice["stop_reason"]
        return self.scorer.score(
            text,
            logprobs,
            finish_reason=choice.get("finish_reason"),
            where="the LlamaIndex response",
            tool_calls=_tool_calls(response, choice),
            **kwargs,
        )

    def _attach(self, response: Any, scored: Scored) -> Any:
        response.additional_kwargs["uncertainty"] = scored.uncertainty.to_json()
        if scored.refused:  # nothing of the refused answer stays: text, last piece, log-probs, raw
            message = getattr(response, "message", None)
            if message is not None:  # the refusal its one block: no withheld call is left
                message.blocks = [TextBlock(text=scored.text)]
                message.additional_kwargs.pop("tool_calls", None)
            else:
                response.text = scored.text
            if getattr(response, "delta", None) is not None:
                response.delta = scored.text  # a stream's refusal is its one response
            response.logprobs = None
            response.raw = None
        return response


class UncertaintyLLM(_Scoring):
    """An LLM whose responses carry ``additional_kwargs["uncertainty"]`` (:func:`with_uncertainty`);
    anything else goes to the wrapped LLM."""

    def __init__(self, llm: Any, scorer: AnswerScorer, *, top_logprobs: int = 1) -> None:
        # greedy whatever the LLM was built with (LlamaIndex's OpenAI defaults to 0.1)
        self.llm = llm.model_copy(update=scorer.policy.pin({}, top_logprobs=top_logprobs))
        self.scorer = scorer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.llm, name)

    def chat(self, messages: Any, **kwargs: Any) -> Any:
        response = self.llm.chat(messages, **kwargs)
        return self._attach(response, self._score(response))

    async def achat(self, messages: Any, **kwargs: Any) -> Any:
        response = await self.llm.achat(messages, **kwargs)
        return self._attach(response, self._score(response))

    def complete(self, prompt: str, **kwargs: Any) -> Any:
        response = self.llm.complete(prompt, **kwargs)
        return self._attach(response, self._score(response))

    async def acomplete(self, prompt: str, **kwargs: Any) -> Any:
        response = await self.llm.acomplete(prompt, **kwargs)
        return self._attach(response, self._score(response))

    def stream_chat(self, messages: Any, **kwargs: Any) -> Iterator[Any]:
        return self._held(self.llm.stream_chat(messages, **kwargs))

    def stream_complete(self, prompt: str, **kwargs: Any) -> Iterator[Any]:
        return self._held(self.llm.stream_complete(prompt, **kwargs))

    async def astream_chat(self, messages: Any, **kwargs: Any) -> AsyncIterator[Any]:
        return self._aheld(await self.llm.astream_chat(messages, **kwargs))

    async def astream_complete(self, prompt: str, **kwargs: Any) -> AsyncIterator[Any]:
        return self._aheld(await self.llm.astream_complete(prompt, **kwargs))

    # Function calling: the function-calling LLM's own methods, run on this wrapper so that
    # their chat goes through the scoring ``chat`` above (and its gate).
    def chat_with_tools(self, tools: Any, *args: Any, **kwargs: Any) -> Any:
        return type(self.llm).chat_with_tools(self, tools, *args, **kwargs)

    async def achat_with_tools(self, tools: Any, *args: Any, **kwargs: Any) -> Any:
        return await type(self.llm).achat_with_tools(self, tools, *args, **kwargs)

    def stream_chat_with_tools(self, tools: Any, *args: Any, **kwargs: Any) -> Any:
        return type(self.llm).stream_chat_with_tools(self, tools, *args, **kwargs)

    async def astream_chat_with_tools(self, tools: Any, *args: Any, **kwargs: Any) -> Any:
        return await type(self.llm).astream_chat_with_tools(self, tools, *args, **kwargs)

    def predict_and_call(self, tools: Any, *args: Any, **kwargs: Any) -> Any:
        return type(self.llm).predict_and_call(self, tools, *args, **kwargs)

    async def apredict_and_call(self, tools: Any, *args: Any, **kwargs: Any) -> Any:
        return await type(self.llm).apredict_and_call(self, tools, *args, **kwargs)

    def get_tool_calls_from_response(self, response: Any, *args: Any, **kwargs: Any) -> Any:
        """The LLM's own, but a response whose calls were withheld has none, and is no error
        (``predict_and_call`` then answers with the refusal instead of raising)."""
        if (response.additional_kwargs.get("uncertainty") or {}).get("refused"):
            return []
        return self.llm.get_tool_calls_from_response(response, *args, **kwargs)

    # A stream's responses go out as they come, the last one carrying the whole answer's
    # uncertainty; under refuse they are held until the answer is decided (the policy's wrap).
    def _held(self, stream: Iterator[Any]) -> Iterator[Any]:
        entries: list[dict[str, Any]] = []
        return self.scorer.policy.wrap(_taking(stream, entries), self._settle(entries))

    def _aheld(self, stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        entries: list[dict[str, Any]] = []
        return self.scorer.policy.awrap(_ataking(stream, entries), self._settle(entries))

    def _settle(self, entries: list[dict[str, Any]]) -> Callable[[list[Any]], list[Any]]:
        def settle(unsent: list[Any]) -> list[Any]:
            if not unsent:
                return []
            last = unsent[-1]
            scored = self._score(last, entries)
            if scored.refused:  # the refusal alone: nothing of the refused answer
                return [self._attach(last, scored)]
            return [*unsent[:-1], self._attach(last, scored)]

        return settle


def _taking(stream: Iterator[Any], entries: list[dict[str, Any]]) -> Iterator[Any]:
    """``stream``'s responses, their log-prob entries added to ``entries`` as they pass."""
    for response in stream:
        entries += _chunk_entries(response)
        yield response


async def _ataking(stream: AsyncIterator[Any], entries: list[dict[str, Any]]) -> AsyncIterator[Any]:
    async for response in stream:
        entries += _chunk_entries(response)
        yield response


def with_uncertainty(
    llm: Any,
    *,
    policy: AbstentionPolicy | str = "annotate",
    calibration: str | Path | None = None,
    threshold: float | None = None,
    server: str = "generic",
    prompt_format: str | None = "chat",
    top_logprobs: int = 1,
    tool_argument_threshold: float | None = None,
) -> UncertaintyLLM:
    """``llm`` (an OpenAI-compatible LlamaIndex LLM) with G-NLL on every response; the options are
    those of :func:`gnll.integrations.langchain.with_uncertainty`. Decoding is greedy
    (temperature 0: G-NLL is the greedy answer's)."""
    scorer = AnswerScorer(
        policy=make_policy(policy, calibration=calibration, threshold=threshold),
        server=server,
        prompt_format=prompt_format,
        tool_argument_threshold=tool_argument_threshold,
    )
    return UncertaintyLLM(llm, scorer, top_logprobs=top_logprobs)


class UncertaintyEventHandler(BaseEventHandler, _Scoring):
    """Score every LLM response LlamaIndex's instrumentation reports (streams included).

    It only observes: a handler sees a response after the caller got it, so ``policy`` is
    ``annotate`` or ``flag`` (``refuse`` is :func:`with_uncertainty`'s, which holds streams).

    Register it with ``llama_index.core.instrumentation.get_dispatcher().add_event_handler(h)``;
    the LLM must be asked for log-probs (``logprobs=True, top_logprobs=1, temperature=0``). Each
    record goes to ``on_uncertainty(record, event)`` and onto the response
    (``additional_kwargs["uncertainty"]``); ``records`` keeps the last 1000, ``errors`` why a
    response could not be scored (observing never breaks the application).
    """

    scorer: Any = None
    on_uncertainty: Any = None
    records: list = []
    errors: list = []
    streams: dict = {}

    def __init__(
        self,
        on_uncertainty: Callable[[Uncertainty, Any], None] | None = None,
        *,
        policy: AbstentionPolicy | str = "annotate",
        calibration: str | Path | None = None,
        threshold: float | None = None,
        server: str = "generic",
        prompt_format: str | None = "chat",
    ) -> None:
        super().__init__()
        self.scorer = AnswerScorer(
            policy=observing_policy(policy, calibration=calibration, threshold=threshold),
            server=server,
            prompt_format=prompt_format,
        )
        self.on_uncertainty = on_uncertainty
        self.records, self.errors, self.streams = [], [], {}

    @classmethod
    def class_name(cls) -> str:
        return "GnllUncertaintyEventHandler"

    def handle(self, event: Any, **kwargs: Any) -> None:
        key = getattr(event, "span_id", None)
        if isinstance(event, (LLMChatInProgressEvent, LLMCompletionInProgressEvent)):
            self.streams.setdefault(key, []).extend(_chunk_entries(event.response))
            return
        if not isinstance(event, (LLMChatEndEvent, LLMCompletionEndEvent)):
            return
        if event.response is None:
            return
        streamed = self.streams.pop(key, None)
        try:
            scored = self._score(event.response, streamed)
        except ValueError as exc:
            self.errors = [*self.errors[-999:], str(exc)]
            return
        self._attach(event.response, scored)
        self.records = [*self.records[-999:], scored.uncertainty]
        if self.on_uncertainty is not None:
            self.on_uncertainty(scored.uncertainty, event)
