"""What the two translated APIs share: reading the chat-completions reply they are served from.

``/v1/responses`` (:mod:`gnll.serving.responses_api`) and ``/v1/messages``
(:mod:`gnll.serving.messages_api`) are served through the chat-completions path of whichever
service runs (in-process, proxy, cascade): the request becomes a chat-completions request, the
service answers it with its G-NLL, policy (refuse, escalate, early) and ``uncertainty`` record, and
the reply is turned into the API's own body or events. So the same question gets the same G-NLL on
all three APIs, and the policy holds alike.

:class:`Translated` is what both APIs do alike (parse, the chat body's frame, the reply's frame);
:class:`ChatDelta` reads one chat-completions stream chunk; :func:`chat_chunks` reads a service's
stream (strings or bytes, one or several events per piece) as a sequence of parsed chunks.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel

from gnll.backends.openai.parse import logprob_entries
from gnll.serving.responses import Reply

if TYPE_CHECKING:
    from gnll.serving.schemas import ChatCompletionRequest, CompletionRequest

#: Response header that says an answer was served through the chat-completions path.
VIA_HEADER = "X-Gnll-Served-Via"
VIA = "chat.completions"


#: A translated API's typed request.
RequestT = TypeVar("RequestT", bound=BaseModel)

#: A stream of server-sent events, as a service returns it.
EventStream = Iterator[str] | AsyncIterator[str]


class TranslatedAPI(Protocol[RequestT]):
    """One API gnll serves through the chat-completions path (the app's seam for a new route)."""

    #: The route (``/v1/responses``).
    route: ClassVar[str]
    #: The name the access log, metrics and tracing use (``"responses"``).
    name: ClassVar[str]

    def parse(self, raw: dict[str, Any]) -> RequestT:
        """The typed request (a pydantic ``ValidationError`` or a ``RequestError`` if invalid)."""
        ...

    def chat_body(self, request: RequestT) -> dict[str, Any]:
        """The chat-completions request body that asks the same question."""
        ...

    def reply(
        self, reply: Reply, request: RequestT, chat: ChatCompletionRequest | CompletionRequest
    ) -> Reply:
        """The chat reply as this API's body or stream (records, headers and status kept)."""
        ...

    def error_body(
        self, message: str, type_: str, param: str | None, code: str | None
    ) -> dict[str, Any]:
        """This API's error envelope."""
        ...


class TranslatedRequest(Protocol):
    """What a translated API's typed request offers the chat path."""

    stream: bool

    def check_supported(self) -> None:
        """A :class:`~gnll.serving.errors.RequestError` for what gnll does not serve."""
        ...

    def chat_messages(self) -> list[dict[str, Any]]:
        """The conversation as chat-completions messages."""
        ...


#: A translated API's request, as its :class:`Translated` reads it.
TranslatedT = TypeVar("TranslatedT", bound=TranslatedRequest)


class Translated(Generic[TranslatedT]):
    """A :class:`TranslatedAPI`'s frame: each API says its request model, the chat options it
    asks with, and how a chat reply's body, error and stream read in its own shape."""

    #: The API's typed request (a pydantic model with :class:`TranslatedRequest`'s methods).
    request_model: ClassVar[type[BaseModel]]

    def parse(self, raw: dict[str, Any]) -> TranslatedT:
        req: TranslatedT = self.request_model.model_validate(raw)  # type: ignore[assignment]
        req.check_supported()
        return req

    def chat_body(self, request: TranslatedT) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": request.chat_messages(), "stream": request.stream}
        body.update((k, v) for k, v in self.chat_options(request).items() if v is not None)
        if request.stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def chat_options(self, request: TranslatedT) -> dict[str, Any]:
        """The chat request's other fields, in order (``None``: left out)."""
        raise NotImplementedError

    def reply(
        self, reply: Reply, request: TranslatedT, chat: ChatCompletionRequest | CompletionRequest
    ) -> Reply:
        headers = {**(reply.headers or {}), VIA_HEADER: VIA}
        if reply.stream is not None:
            stream = self.events(reply.stream, request, chat)
            return Reply(None, reply.records, stream, reply.prompt, reply.status, headers)
        body = reply.body or {}
        out = self.body(body, request, chat) if "choices" in body else self.error_of(body)
        return Reply(out, reply.records, None, reply.prompt, reply.status, headers)

    def body(
        self,
        body: dict[str, Any],
        request: TranslatedT,
        chat: ChatCompletionRequest | CompletionRequest,
    ) -> dict[str, Any]:
        """A chat reply's body as this API's body."""
        raise NotImplementedError

    def error_of(self, body: dict[str, Any]) -> dict[str, Any]:
        """A chat reply's error envelope as this API's."""
        raise NotImplementedError

    def events(
        self,
        stream: EventStream,
        request: TranslatedT,
        chat: ChatCompletionRequest | CompletionRequest,
    ) -> AsyncIterator[str]:
        """A chat reply's stream as this API's events."""
        raise NotImplementedError


@dataclass
class ChatToolCall:
    """One tool call being read from a chat stream (or body)."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class ChatAnswer:
    """One chat choice, read from a body or accumulated from a stream."""

    content: str = ""
    reasoning: str | None = None
    tool_calls: list[ChatToolCall] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    uncertainty: dict[str, Any] | None = None

    @classmethod
    def of_body(cls, body: dict[str, Any]) -> ChatAnswer:
        """The first choice of a ``chat.completion`` body (the translated APIs ask for one)."""
        choice = body["choices"][0]
        message = choice.get("message") or {}
        calls = [
            ChatToolCall(
                k,
                str(tc.get("id") or ""),
                str((tc.get("function") or {}).get("name") or ""),
                str((tc.get("function") or {}).get("arguments") or ""),
            )
            for k, tc in enumerate(message.get("tool_calls") or [])
        ]
        return cls(
            content=message.get("content") or "",
            reasoning=message.get("reasoning") or message.get("reasoning_content"),
            tool_calls=calls,
            logprobs=logprob_entries(choice.get("logprobs")),
            finish_reason=choice.get("finish_reason"),
            uncertainty=choice.get("uncertainty"),
        )


@dataclass
class ChatDelta:
    """What one chat stream chunk adds to its (single) choice."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    uncertainty: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    id: str | None = None
    model: str | None = None

    @classmethod
    def of_chunk(cls, chunk: dict[str, Any]) -> ChatDelta:
        if "error" in chunk:
            err = chunk["error"]
            return cls(error=err if isinstance(err, dict) else {"message": str(err)})
        out = cls(usage=chunk.get("usage"), id=chunk.get("id"), model=chunk.get("model"))
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            out.content += delta.get("content") or ""
            out.reasoning += delta.get("reasoning") or delta.get("reasoning_content") or ""
            out.tool_calls.extend(delta.get("tool_calls") or [])
            out.logprobs.extend(logprob_entries(choice.get("logprobs")))
            out.finish_reason = choice.get("finish_reason") or out.finish_reason
            out.uncertainty = choice.get("uncertainty") or out.uncertainty
        return out


def _events(piece: str | bytes) -> Iterator[dict[str, Any] | None]:
    """The JSON chunks of one piece of a chat stream (``None`` for ``[DONE]``)."""
    text = piece.decode() if isinstance(piece, bytes) else piece
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                yield None
            elif data:
                yield json.loads(data)


async def chat_chunks(stream: EventStream) -> AsyncIterator[ChatDelta]:
    """The chunks of a service's chat stream, parsed, up to ``[DONE]``; closes the stream at the end
    (or when the reader stops early: the client left)."""
    try:
        if isinstance(stream, AsyncIterator):
            async for piece in stream:
                for chunk in _events(piece):
                    if chunk is None:
                        return
                    yield ChatDelta.of_chunk(chunk)
        else:
            for piece in stream:
                for chunk in _events(piece):
                    if chunk is None:
                        return
                    yield ChatDelta.of_chunk(chunk)
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()


def event(name: str, data: dict[str, Any]) -> str:
    """One named server-sent event (the ``anthropic`` SDK dispatches on the ``event:`` line)."""
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


def usage_counts(usage: dict[str, Any] | None) -> tuple[int, int] | None:
    """``(prompt_tokens, completion_tokens)`` of a chat ``usage`` (``None``: nobody counted)."""
    if not usage:
        return None
    return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
