"""Reading an upstream's stream: :class:`UpstreamStream`, the proxy's one reader of server-sent
events, and :class:`StreamedChoice`, a streamed choice reassembled so the parser of whole responses
can read it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from gnll.backends.early import EarlyDecided
from gnll.backends.openai.parse import join_logprobs, logprob_pairs
from gnll.backends.openai.reasoning import ReasoningStream
from gnll.measures.early import EarlyDecision
from gnll.policy import Answer
from gnll.serving.protocol.common import UNBOUNDED

if TYPE_CHECKING:
    from gnll.serving.protocol.common import Shape


class StreamedChoice:
    """The pieces of one choice of a server-sent-event stream, in arrival order.

    Examples
    --------
    >>> from gnll.serving.protocol.completions import COMPLETIONS
    >>> sc = StreamedChoice(COMPLETIONS)
    >>> sc.add({"text": " Par", "logprobs": {"tokens": [" Par"], "token_logprobs": [-0.1]}})
    >>> sc.add({"text": "is", "logprobs": {"tokens": ["is"], "token_logprobs": [-0.2]},
    ...         "finish_reason": "stop"})
    >>> c = sc.choice()
    >>> c["text"], c["logprobs"]["token_logprobs"], c["finish_reason"]
    (' Paris', [-0.1, -0.2], 'stop')
    """

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.text: list[str] = []
        self.logprobs: list[Any] = []  # each chunk's, in either shape
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason: Any = None
        self.has_stop_reason = False
        self.reasoning: list[str] = []
        #: Tool calls by their index, their pieces joined (``id``, ``type``, name, arguments).
        self.tool_calls: dict[int, dict[str, Any]] = {}
        #: Each token labelled trace / marker / answer by the delta it came with.
        self.labeller = ReasoningStream()

    def add(self, choice: dict[str, Any]) -> None:
        self.labeller.add(choice)
        text, reasoning = self.shape.delta_texts(choice)
        self.text.append(text)
        if reasoning is not None:
            self.reasoning.append(reasoning)
        self.logprobs.append(choice.get("logprobs"))
        if isinstance(choice.get("token_ids"), list):
            self.token_ids.extend(choice["token_ids"])
        delta = choice.get("delta")
        for call in (delta.get("tool_calls") if isinstance(delta, dict) else None) or []:
            self._add_call(call)
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        if "stop_reason" in choice:
            self.has_stop_reason = True
            if choice["stop_reason"] is not None:
                self.stop_reason = choice["stop_reason"]

    def _add_call(self, piece: dict[str, Any]) -> None:
        """One ``delta.tool_calls[]`` piece: the first of a call names it, the others add to its
        arguments (OpenAI's stream shape)."""
        k = piece.get("index", len(self.tool_calls))
        call = self.tool_calls.setdefault(
            k, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if piece.get("id"):
            call["id"] = piece["id"]
        fn = piece.get("function") or {}
        call["function"]["name"] += fn.get("name") or ""
        call["function"]["arguments"] += fn.get("arguments") or ""

    @property
    def labels(self) -> list[Any] | None:
        """Per-token trace/marker/answer labels when the stream carried reasoning, else ``None``."""
        return self.labeller.labels if self.labeller.reasoning else None

    def choice(self) -> dict[str, Any]:
        """A non-streaming ``choices[i]`` with everything the stream said."""
        text = "".join(self.text)
        # in a whole response's order: the message (text), its log-probs, the finish reason
        out: dict[str, Any] = self.shape.whole_choice(text)
        out.update(logprobs=join_logprobs(self.logprobs), finish_reason=self.finish_reason)
        if any(self.reasoning):
            out["message"]["reasoning"] = "".join(self.reasoning)
        if self.tool_calls and isinstance(out.get("message"), dict):
            out["message"]["tool_calls"] = [self.tool_calls[k] for k in sorted(self.tool_calls)]
            if not text:  # a message of calls only has no content (a whole response's shape)
                out["message"]["content"] = None
        if self.token_ids:
            out["token_ids"] = self.token_ids
        if self.has_stop_reason:
            out["stop_reason"] = self.stop_reason
        return out


class LineSource(Protocol):
    """An open streamed response, read line by line (an ``httpx.Response``)."""

    def aiter_lines(self) -> AsyncIterator[str]:
        """The body's lines as they arrive."""
        ...

    async def aclose(self) -> None:
        """Close the connection (the upstream sees the client leave)."""
        ...


class StreamWatch(Protocol):
    """What :class:`UpstreamStream` tells about each choice as it arrives (the proxy's exact early
    decision, :class:`~gnll.serving.proxy.EarlyWatch`)."""

    def see(self, acc: StreamedChoice, choice: dict[str, Any]) -> None:
        """``choice`` (a chunk's choice) has just been added to ``acc``."""

    @property
    def done(self) -> bool:
        """Whether to stop reading (the connection is then closed)."""


class UpstreamEventError(Exception):
    """The upstream sent an error event (``chunk``: the event as it came)."""

    def __init__(self, chunk: dict[str, Any]) -> None:
        super().__init__(str(chunk.get("error")))
        self.chunk = chunk

    @property
    def message(self) -> str:
        """The event's message."""
        err = self.chunk.get("error")
        return str(err.get("message") if isinstance(err, dict) else err)


class UpstreamBrokeError(Exception):
    """The upstream's stream broke off (the connection, or a line that is not JSON)."""


class UpstreamIdle(Exception):
    """An upstream stream that went silent for longer than the idle timeout."""


async def idle_bounded(response: LineSource, idle: float, upstream: str) -> AsyncIterator[str]:
    """The lines of a streamed upstream response; after the first, each must come within ``idle``
    seconds (:class:`UpstreamIdle` otherwise). The first may take the request's whole timeout:
    an upstream may queue a request before it answers."""
    lines = response.aiter_lines()
    first = True
    while True:
        try:
            line = await (anext(lines) if first else asyncio.wait_for(anext(lines), idle))
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise UpstreamIdle(
                f"upstream {upstream} sent nothing for {idle:g} s in the middle of a stream "
                "(--upstream_idle_timeout): its engine may have stopped with the connection open"
            ) from None
        first = False
        yield line


class UpstreamStream:
    """The one reader of an upstream's server-sent events: each chunk parsed, each choice
    reassembled (:class:`StreamedChoice`) and shown to an optional :class:`StreamWatch`.

    Iterating yields the chunks that carry choices (or neither choices nor usage) in arrival
    order; a usage-only chunk is kept in :attr:`usage_chunk`. An error event raises
    :class:`UpstreamEventError`, a broken stream :class:`UpstreamBrokeError`; the response is
    closed when iteration ends, however it ends. After it, :attr:`finished` says whether
    ``[DONE]`` came.

    Examples
    --------
    >>> import asyncio
    >>> from gnll.serving.protocol.completions import COMPLETIONS
    >>> class Lines:
    ...     async def aiter_lines(self):
    ...         yield 'data: {"id": "x", "choices": [{"index": 0, "text": "Hi", "finish_reason": "stop"}]}'
    ...         yield "data: [DONE]"
    ...     async def aclose(self): pass
    >>> async def read():
    ...     stream = UpstreamStream(Lines(), COMPLETIONS)
    ...     chunks = [c async for c in stream]
    ...     return len(chunks), stream.finished, stream.choices[0].choice()["text"]
    >>> asyncio.run(read())
    (1, True, 'Hi')
    """

    def __init__(
        self,
        response: LineSource,
        shape: Shape,
        watch: StreamWatch | None = None,
        *,
        idle: tuple[float, str] | None = None,
    ) -> None:
        self.response = response
        #: Seconds a stream may stay silent after its first line, and the upstream it names
        #: (:class:`UpstreamIdle` past it).
        self.idle = idle
        self.shape = shape
        self.watch = watch
        #: Each choice so far, by its index.
        self.choices: dict[int, StreamedChoice] = {}
        #: The last chunk of any kind, and the last that carried choices.
        self.last: dict[str, Any] = {}
        self.last_with_choices: dict[str, Any] = {}
        #: The last ``usage`` any chunk carried, and the last usage-only chunk.
        self.usage: Any = None
        self.usage_chunk: dict[str, Any] | None = None
        self.finished = False
        self._chunks = self._read()

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._chunks

    async def aclose(self) -> None:
        """Stop reading and close the response (a reader left mid-stream closes its upstream
        connection now, not when it is collected)."""
        await self._chunks.aclose()
        await self.response.aclose()

    async def _read(self) -> AsyncGenerator[dict[str, Any], None]:
        try:
            lines = (
                idle_bounded(self.response, *self.idle)
                if self.idle is not None
                else self.response.aiter_lines()
            )
            async for line in lines:
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    self.finished = True
                    return
                chunk = json.loads(payload)
                if isinstance(chunk, dict) and "error" in chunk:
                    raise UpstreamEventError(chunk)
                self.last = chunk
                if chunk.get("usage") is not None:
                    self.usage = chunk["usage"]
                    if not chunk.get("choices"):
                        self.usage_chunk = chunk
                        continue
                if chunk.get("choices"):
                    self.last_with_choices = chunk
                for choice in chunk.get("choices") or []:
                    index = choice.get("index", 0)
                    acc = self.choices.setdefault(index, StreamedChoice(self.shape))
                    acc.add(choice)
                    if self.watch is not None:
                        self.watch.see(acc, choice)
                yield chunk
                if self.watch is not None and self.watch.done:
                    return  # closing the response disconnects from the upstream
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            raise UpstreamBrokeError(f"upstream stream broke off: {exc}") from None
        finally:
            await self.response.aclose()


class EarlyWatch:
    """The exact early decision over a streamed answer (a :class:`StreamWatch` of :class:`UpstreamStream`).

    The tokens of a chunk without ``finish_reason`` are answer tokens the upstream has released
    (a server holds back text that may begin a stop string), so they go to the policy's
    :class:`~gnll.measures.early.EarlyDecision` as they arrive, with their texts (the rule of a
    request with tools reads the calls in them: :class:`gnll.toolwatch.ToolCallDecision`). A
    reasoning model's trace and end-of-reasoning marker are context, not answer: the running
    G-NLL starts at the answer's first token.
    """

    def __init__(self, rule: EarlyDecision) -> None:
        self.rule = rule
        self.tokens: list[str] = []
        self.logprobs: list[float] = []
        self.seen = 0  # tokens received, trace included

    @property
    def done(self) -> bool:
        return self.rule.decided

    def see(self, acc: StreamedChoice, choice: dict[str, Any]) -> None:
        pairs = logprob_pairs(choice.get("logprobs"))
        first, self.seen = self.seen, self.seen + len(pairs)
        if choice.get("finish_reason"):
            return  # the end: the decision is the whole answer's
        start = acc.labeller.answer_start if acc.labeller.reasoning else 0
        for j, (tok, lp) in enumerate(pairs):
            if start is None or first + j < start:
                continue
            self.tokens.append(tok)
            self.logprobs.append(lp)
            self.rule.skip()
            self.rule.release([lp], [str(tok)])

    def outcome(
        self, reader: UpstreamStream, max_new_tokens: int
    ) -> tuple[dict[str, Any], Answer | None]:
        """What the watched stream gave: the answer cut at its decision (and a whole-response
        body with its text), or, undecided, the whole streamed answer as a non-streaming
        response body (and ``None``)."""
        shape, last, rule = reader.shape, reader.last_with_choices, self.rule
        base = {  # a whole response's keys, in their order (choices, then usage)
            "id": last.get("id") or shape.new_id(),
            "object": shape.object,
            "created": last.get("created"),
            "model": last.get("model"),
        }
        if not rule.decided:
            acc = next(iter(reader.choices.values()), StreamedChoice(shape))
            return {**base, "choices": [{"index": 0, **acc.choice()}], "usage": reader.usage}, None
        t = rule.decision.at_token or 0
        text = "".join(self.tokens[:t])
        answer = Answer(
            text=text,
            finish_reason="stop",
            tokens=self.tokens[:t],
            token_logprobs=self.logprobs[:t],
            decoding="greedy",
            measured_logprobs=self.logprobs[:t] or [0.0],
            early=EarlyDecided(
                decided_at_token=t,
                tokens_generated=rule.generated,
                # Unknown when the upstream's own limit applies (no max_tokens asked or set).
                tokens_saved=None
                if max_new_tokens == UNBOUNDED
                else max_new_tokens - rule.generated,
                action=rule.decision.action,
            ),
        )
        whole: dict[str, Any] = {"index": 0, "finish_reason": "stop", "logprobs": None}
        whole.update(shape.whole_choice(text))
        # What was generated until the cut (the trace's tokens included), for clients that bill
        # per token; the prompt's count only where the upstream said it (vLLM), else null.
        usage = reader.usage
        prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        cut_usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": self.seen,
            "total_tokens": None if prompt_tokens is None else int(prompt_tokens) + self.seen,
        }
        return {**base, "choices": [whole], "usage": cut_usage}, answer
