"""LangChain: G-NLL on every message of a chat model (``pip install "gnll[langchain]"``).

:func:`with_uncertainty` wraps a chat model (``ChatOpenAI`` pointed at vLLM, llama.cpp, ``gnll
serve`` or OpenAI) in a Runnable that asks it for log-probs (``logprobs=True, top_logprobs>=1``)
and greedy decoding (temperature 0 unless the model sets one), and returns the same message with
``response_metadata["uncertainty"]``: the object ``gnll serve`` puts on a choice (``g_nll``,
``ln_g_nll``, ``p_correct``, ``abstain``, ``spans``, ...). ``invoke``, ``batch``, ``stream`` and
their async forms all work; a stream ends with one more chunk whose ``response_metadata`` holds the
uncertainty (so the chunks added up give the message ``invoke`` returns). Under ``policy="refuse"``
a likely wrong answer is replaced by the refusal (a stream is then held back until its end).

:class:`UncertaintyCallbackHandler` only observes: it scores every chat model call it sees (for
metrics, tracing or LangSmith feedback) without changing what the chain returns.

Reasoning models: LangChain keeps the log-probs of a reasoning model's trace but drops the trace's
text, so the answer's tokens cannot be told apart; such a response is refused with a
:class:`~gnll.integrations.core.ReasoningTokensError` naming the way out.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.outputs import LLMResult
from langchain_core.runnables import Runnable, RunnableConfig

from gnll.integrations.core import (
    AnswerScorer,
    Scored,
    decoding_of,
    make_policy,
    observing_policy,
)
from gnll.policy import AbstentionPolicy
from gnll.uncertainty import Uncertainty

__all__ = ["UncertaintyCallbackHandler", "UncertaintyRunnable", "with_uncertainty"]


def _text(content: Any) -> str:
    """A message's text (content blocks joined)."""
    if isinstance(content, str):
        return content
    return "".join(
        b if isinstance(b, str) else str(b.get("text", "")) for b in content or [] if b is not None
    )


def _calls(message: BaseMessage) -> list[dict[str, Any]]:
    """The calls an ``AIMessage`` (or a stream's chunks added up) carries, as name and arguments."""
    return [
        {"name": c["name"], "arguments": c.get("args") or {}}
        for c in getattr(message, "tool_calls", None) or []
    ]


def _temperature(chat_model: Any) -> float | None:
    t = getattr(chat_model, "temperature", None)
    return float(t) if isinstance(t, (int, float)) else None


class UncertaintyRunnable(Runnable[Any, BaseMessage]):
    """A chat model whose messages carry ``response_metadata["uncertainty"]`` (see the module)."""

    def __init__(
        self, chat_model: BaseChatModel, scorer: AnswerScorer, *, top_logprobs: int = 1
    ) -> None:
        self.chat_model = chat_model
        self.scorer = scorer
        self.top_logprobs = int(top_logprobs)
        temperature = _temperature(chat_model)
        self.decoding = decoding_of(temperature)
        # G-NLL is the greedy answer's (servers default to sampling): the policy pins it
        given = {} if temperature is None else {"temperature": temperature}
        self.bound = chat_model.bind(**scorer.policy.pin(given, top_logprobs=int(top_logprobs)))

    def __repr__(self) -> str:
        return f"UncertaintyRunnable({self.chat_model!r}, policy={self.scorer.policy.mode!r})"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> UncertaintyRunnable:
        """The chat model's ``bind_tools(tools, **kwargs)``, its calls scored and gated (see the
        module)."""
        bound = self.chat_model.bind_tools(tools, **kwargs)  # type: ignore[attr-defined]
        return UncertaintyRunnable(bound, self.scorer, top_logprobs=self.top_logprobs)

    # ------------------------------------------------------------------ scoring
    def _stop(self, kwargs: dict[str, Any]) -> Sequence[str] | None:
        stop = kwargs.get("stop")
        if stop is None:
            stop = getattr(self.chat_model, "stop", None) or getattr(
                self.chat_model, "stop_sequences", None
            )
        return [stop] if isinstance(stop, str) else stop

    def score(self, message: BaseMessage, stop: Sequence[str] | None = None) -> Scored:
        """The scored answer of a message the chat model returned (with its log-probs)."""
        meta = message.response_metadata or {}
        return self.scorer.score(
            _text(message.content),
            meta.get("logprobs"),
            finish_reason=meta.get("finish_reason"),
            decoding=self.decoding,
            stop=stop,
            where=f"the {type(self.chat_model).__name__} response",
            tool_calls=_calls(message),
        )

    def _attach(self, message: BaseMessage, stop: Sequence[str] | None) -> BaseMessage:
        scored = self.score(message, stop)
        meta = {**message.response_metadata, "uncertainty": scored.uncertainty.to_json()}
        update: dict[str, Any] = {"response_metadata": meta}
        if scored.refused:  # nothing of the refused answer leaves: text, calls, tokens, log-probs
            meta.pop("logprobs", None)
            update.update(_refused(message, scored))
        return message.model_copy(update=update)

    def _closing(
        self, whole: BaseMessage, stop: Sequence[str] | None
    ) -> tuple[Scored, AIMessageChunk]:
        scored = self.score(whole, stop)
        meta = {"uncertainty": scored.uncertainty.to_json()}
        return scored, AIMessageChunk(content="", response_metadata=meta, id=whole.id)

    # ------------------------------------------------------------------ Runnable
    def invoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> BaseMessage:
        return self._attach(self.bound.invoke(input, config, **kwargs), self._stop(kwargs))

    async def ainvoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> BaseMessage:
        message = await self.bound.ainvoke(input, config, **kwargs)
        return self._attach(message, self._stop(kwargs))

    def stream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[BaseMessage]:
        whole: list[Any] = [None]
        chunks = _adding(self.bound.stream(input, config, **kwargs), whole)
        yield from self.scorer.policy.wrap(
            chunks, self._settle(whole, self._stop(kwargs)), greedy=self.decoding == "greedy"
        )

    async def astream(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[BaseMessage]:
        whole: list[Any] = [None]
        chunks = _aadding(self.bound.astream(input, config, **kwargs), whole)
        async for out in self.scorer.policy.awrap(
            chunks, self._settle(whole, self._stop(kwargs)), greedy=self.decoding == "greedy"
        ):
            yield out

    def _settle(
        self, whole: list[Any], stop: Sequence[str] | None
    ) -> Callable[[list[BaseMessage]], list[BaseMessage]]:
        """What a finished stream sends of its unsent chunks: them and one more chunk with the
        uncertainty, or under refuse the refusal alone (:meth:`AbstentionPolicy.wrap`)."""

        def settle(unsent: list[BaseMessage]) -> list[BaseMessage]:
            if whole[0] is None:
                return []
            scored, closing = self._closing(whole[0], stop)
            if scored.refused:  # the refusal alone: no chunk of the answer or its calls
                meta = closing.response_metadata
                return [AIMessageChunk(content=scored.text, response_metadata=meta, id=closing.id)]
            return [*unsent, closing]

        return settle


def _refused(message: BaseMessage, scored: Scored) -> dict[str, Any]:
    """What replaces a refused message's answer: the refusal as its content, and no tool call
    left anywhere a chain (or an agent executing calls) would read one."""
    update: dict[str, Any] = {"content": scored.text}
    if getattr(message, "tool_calls", None) is not None:
        update.update(tool_calls=[], invalid_tool_calls=[])
        if isinstance(message, AIMessageChunk):
            update["tool_call_chunks"] = []
    kwargs = dict(message.additional_kwargs)
    if kwargs.pop("tool_calls", None) is not None:
        update["additional_kwargs"] = kwargs
    return update


def _adding(chunks: Iterator[Any], whole: list[Any]) -> Iterator[Any]:
    """``chunks`` as they come, added up in ``whole[0]`` (the message they make)."""
    for chunk in chunks:
        whole[0] = chunk if whole[0] is None else whole[0] + chunk
        yield chunk


async def _aadding(chunks: AsyncIterator[Any], whole: list[Any]) -> AsyncIterator[Any]:
    async for chunk in chunks:
        whole[0] = chunk if whole[0] is None else whole[0] + chunk
        yield chunk


def with_uncertainty(
    chat_model: BaseChatModel,
    *,
    policy: AbstentionPolicy | str = "annotate",
    calibration: str | Path | None = None,
    threshold: float | None = None,
    min_p_correct: float | None = None,
    refusal: str | None = None,
    server: str = "generic",
    prompt_format: str | None = "chat",
    top_logprobs: int = 1,
    tool_argument_threshold: float | None = None,
) -> UncertaintyRunnable:
    """``chat_model`` with G-NLL on every message (``response_metadata["uncertainty"]``).

    Parameters
    ----------
    chat_model:
        A LangChain chat model that returns OpenAI log-probs (``ChatOpenAI`` and its kin).
    policy, calibration, threshold, min_p_correct, refusal:
        As ``gnll serve``'s options (:func:`gnll.integrations.core.make_policy`): ``"annotate"``,
        ``"flag"`` or ``"refuse"``; a ``gnll calibrate`` file for ``p_correct``; or a G-NLL
        threshold.
    server:
        What serves the model (``"vllm"``, ``"llama.cpp"``, ``"gnll"``, ``"openai"``,
        ``"generic"``): vLLM reports the end-of-sequence token's log-prob, which is not the
        answer's.
    top_logprobs:
        Alternatives asked for per token (at least 1: some servers return no log-probs without).
    tool_argument_threshold:
        Under ``refuse``, also withhold a tool call one of whose argument values' NLL is above it.

    Examples
    --------
    With ``gnll serve`` running (docs/quickstart.md runs this recipe)::

        from langchain_openai import ChatOpenAI
        llm = with_uncertainty(ChatOpenAI(base_url="http://127.0.0.1:8000/v1", api_key="x",
                                          model="smollm2-135m-instruct"), server="gnll")
        llm.invoke("Capital of France?").response_metadata["uncertainty"]["g_nll"]
    """
    scorer = AnswerScorer(
        policy=make_policy(
            policy,
            calibration=calibration,
            threshold=threshold,
            min_p_correct=min_p_correct,
            refusal=refusal,
            model=getattr(chat_model, "model_name", None),
        ),
        server=server,
        prompt_format=prompt_format,
        tool_argument_threshold=tool_argument_threshold,
    )
    return UncertaintyRunnable(chat_model, scorer, top_logprobs=top_logprobs)


class UncertaintyCallbackHandler(BaseCallbackHandler):
    """Observe the G-NLL of every chat model answer a chain produces, without changing it.

    The chat model must be asked for log-probs (``ChatOpenAI(logprobs=True, top_logprobs=1,
    temperature=0)``). Each answer's :class:`~gnll.uncertainty.Uncertainty` goes to
    ``on_uncertainty(record, run_id)`` (e.g. a metric, an OpenTelemetry event, or LangSmith
    feedback: ``Client().create_feedback(run_id=run_id, key="g_nll", score=record.g_nll)``) and is
    kept in ``records[run_id]``; a response it cannot score goes to ``errors[run_id]`` (observing
    never breaks the chain).
    """

    raise_error = False

    def __init__(
        self,
        on_uncertainty: Callable[[Uncertainty, UUID], None] | None = None,
        *,
        policy: AbstentionPolicy | str = "annotate",
        calibration: str | Path | None = None,
        threshold: float | None = None,
        server: str = "generic",
        prompt_format: str | None = "chat",
    ) -> None:
        self.scorer = AnswerScorer(
            policy=observing_policy(policy, calibration=calibration, threshold=threshold),
            server=server,
            prompt_format=prompt_format,
        )
        self.on_uncertainty = on_uncertainty
        self.records: dict[UUID, list[Uncertainty]] = {}
        self.errors: dict[UUID, str] = {}
        self._stops: dict[UUID, Any] = {}
        self._decoding: dict[UUID, str] = {}

    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: Any, *, run_id: UUID, **kwargs: Any
    ) -> None:
        params = kwargs.get("invocation_params") or {}
        self._stops[run_id] = params.get("stop")
        self._decoding[run_id] = decoding_of(params.get("temperature"))

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        stop, decoding = self._stops.pop(run_id, None), self._decoding.pop(run_id, "greedy")
        out: list[Uncertainty] = []
        try:
            for generations in response.generations:
                for gen in generations:
                    info = dict(gen.generation_info or {})
                    message = getattr(gen, "message", None)
                    if message is not None:
                        info = {**message.response_metadata, **info}
                    scored = self.scorer.score(
                        _text(message.content) if message is not None else gen.text,
                        info.get("logprobs"),
                        finish_reason=info.get("finish_reason"),
                        decoding=decoding,
                        stop=stop,
                        where=f"run {run_id}",
                        tool_calls=_calls(message) if message is not None else None,
                    )
                    out.append(scored.uncertainty)
        except ValueError as exc:  # LogprobError and its kin: say why, keep the chain running
            self.errors[run_id] = str(exc)
            return
        self.records[run_id] = out
        if self.on_uncertainty is not None:
            for record in out:
                self.on_uncertainty(record, run_id)
