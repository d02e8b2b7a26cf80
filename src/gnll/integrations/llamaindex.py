"""LlamaIndex: G-NLL on chat and completion responses (``pip install "gnll[llamaindex]"``).

LlamaIndex's own ``ChatResponse.logprobs`` keeps each position's *alternatives* only, and drops a
position whose ``top_logprobs`` list is empty (``from_openai_token_logprobs``), so a model asked for
``logprobs`` without ``top_logprobs`` silently loses tokens, and the sampled token's own log-prob is
not a field. gnll therefore reads the server's response that LlamaIndex keeps in ``response.raw``
(every position, with its own log-prob, and vLLM's ``stop_reason``), and asks for
``top_logprobs >= 1`` anyway.

- :func:`with_uncertainty` wraps an OpenAI-compatible LLM (``OpenAILike``, ``OpenAI``): log-probs
  on, temperature 0, and ``response.additional_kwargs["uncertainty"]`` on every ``chat``,
  ``complete``, ``stream_chat`` (on its last response) and their async forms.
- :class:`UncertaintyEventHandler` is an instrumentation handler (``get_dispatcher().add_event_handler``)
  that scores every ``LLMChatEndEvent`` / ``LLMCompletionEndEvent`` it sees (streams included) and
  puts the same record on the response.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import (
    LLMChatEndEvent,
    LLMChatInProgressEvent,
    LLMCompletionEndEvent,
    LLMCompletionInProgressEvent,
)

from gnll.integrations.core import AnswerScorer, Scored, make_policy
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
    """The log-prob entries of one streamed chunk (``response.raw`` of a streamed response)."""
    choice = _raw_choice(response)
    lp = (choice or {}).get("logprobs")
    return list(lp.get("content") or []) if isinstance(lp, dict) else []


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
        stream = "delta" in choice
        logprobs = {"content": streamed or []} if stream else choice.get("logprobs")
        kwargs: dict[str, Any] = {}
        if "stop_reason" in choice:
            kwargs["stop_reason"] = choice["stop_reason"]
        return self.scorer.score(
            text,
            logprobs,
            finish_reason=choice.get("finish_reason"),
            where="the LlamaIndex response",
            **kwargs,
        )

    def _attach(self, response: Any, scored: Scored) -> Any:
        response.additional_kwargs["uncertainty"] = scored.uncertainty.to_json()
        if scored.refused:
            message = getattr(response, "message", None)
            if message is not None:
                message.content = scored.text
            else:
                response.text = scored.text
            response.logprobs = None
        return response


class UncertaintyLLM(_Scoring):
    """An LLM whose responses carry ``additional_kwargs["uncertainty"]`` (:func:`with_uncertainty`);
    anything else goes to the wrapped LLM."""

    def __init__(self, llm: Any, scorer: AnswerScorer, *, top_logprobs: int = 1) -> None:
        self.llm = llm.model_copy(
            update={"logprobs": True, "top_logprobs": max(1, top_logprobs), "temperature": 0.0}
        )
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
        entries: list[dict[str, Any]] = []
        last = None
        for response in self.llm.stream_chat(messages, **kwargs):
            entries += _chunk_entries(response)
            if last is not None:
                yield last
            last = response
        if last is not None:  # the last response carries the whole answer's uncertainty
            yield self._attach(last, self._score(last, entries))

    async def astream_chat(self, messages: Any, **kwargs: Any) -> AsyncIterator[Any]:
        entries: list[dict[str, Any]] = []
        last = None
        async for response in await self.llm.astream_chat(messages, **kwargs):
            entries += _chunk_entries(response)
            if last is not None:
                yield last
            last = response
        if last is not None:
            yield self._attach(last, self._score(last, entries))


def with_uncertainty(
    llm: Any,
    *,
    policy: AbstentionPolicy | str = "annotate",
    calibration: str | Path | None = None,
    threshold: float | None = None,
    server: str = "generic",
    prompt_format: str | None = "chat",
    top_logprobs: int = 1,
) -> UncertaintyLLM:
    """``llm`` (an OpenAI-compatible LlamaIndex LLM) with G-NLL on every response; the options are
    those of :func:`gnll.integrations.langchain.with_uncertainty`. Decoding is greedy
    (temperature 0: G-NLL is the greedy answer's)."""
    scorer = AnswerScorer(
        policy=make_policy(policy, calibration=calibration, threshold=threshold),
        server=server,
        prompt_format=prompt_format,
    )
    return UncertaintyLLM(llm, scorer, top_logprobs=top_logprobs)


class UncertaintyEventHandler(BaseEventHandler, _Scoring):
    """Score every LLM response LlamaIndex's instrumentation reports (streams included).

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
            policy=make_policy(policy, calibration=calibration, threshold=threshold),
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
