"""``POST /v1/messages``: the Anthropic Messages API, served through the chat-completions path.

A request becomes a chat-completions request (``system`` the system message, ``tool_use`` blocks an
assistant message's ``tool_calls``, ``tool_result`` blocks ``tool`` messages, ``stop_sequences``
``stop``), the service answers it with its G-NLL and policy (:mod:`gnll.serving.translation`), and
the answer comes back as a ``message``: a ``thinking`` block with a reasoning model's trace, a
``text`` block, a ``tool_use`` block per tool call, ``stop_reason`` (``end_turn``, ``max_tokens``,
``tool_use``) and ``usage``. The answer's ``uncertainty`` record rides in an extra field of the
message (and of a stream's ``message_delta`` event), and in the ``X-Uncertainty-*`` headers. Errors
come in Anthropic's envelope (``{"type": "error", "error": {...}}``).

A stream sends Anthropic's events, each with its ``event:`` line: ``message_start``, per block
``content_block_start``, ``content_block_delta`` (``thinking_delta``, ``text_delta``,
``input_json_delta``) and ``content_block_stop``, then ``message_delta`` (stop reason, output
tokens, the record) and ``message_stop``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from gnll.serving.protocol.messages import (
    STOP_REASONS,
    ContentBlock,
    MessageObject,
    MessagesRequest,
    StreamEvent,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
    error_body,
)
from gnll.serving.schemas import ChatCompletionRequest, CompletionRequest
from gnll.serving.translation import (
    ChatAnswer,
    EventStream,
    Translated,
    chat_chunks,
    event,
    usage_counts,
)


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as the ``input`` object (not an object: under ``"arguments"``)."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


class MessagesAPI(Translated[MessagesRequest]):
    """The ``/v1/messages`` route (:class:`~gnll.serving.translation.TranslatedAPI`)."""

    route: ClassVar[str] = "/v1/messages"
    name: ClassVar[str] = "messages"
    request_model = MessagesRequest

    def chat_options(self, request: MessagesRequest) -> dict[str, Any]:
        return {
            "max_tokens": request.max_tokens,
            "model": request.model,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "stop": request.stop_sequences or None,
            "tools": request.chat_tools(),
            "tool_choice": request.chat_tool_choice(),
        }

    def error_body(
        self, message: str, type_: str, param: str | None, code: str | None
    ) -> dict[str, Any]:
        return error_body(message, type_)

    def error_of(self, body: dict[str, Any]) -> dict[str, Any]:
        err = body.get("error") or {}
        return error_body(str(err.get("message")), str(err.get("type") or "api_error"))

    def body(
        self,
        body: dict[str, Any],
        request: MessagesRequest,
        chat: ChatCompletionRequest | CompletionRequest,
    ) -> dict[str, Any]:
        answer = ChatAnswer.of_body(body)
        counts = usage_counts(body.get("usage")) or (0, 0)
        message = MessageObject(
            id=_id("msg"),
            model=body.get("model") or chat.model or "",
            content=_blocks(answer),
            stop_reason=STOP_REASONS.get(answer.finish_reason or "stop", "end_turn"),
            usage=Usage(input_tokens=counts[0], output_tokens=counts[1]),
            uncertainty=answer.uncertainty,
        )
        return message.model_dump(mode="json")

    def events(
        self,
        stream: EventStream,
        request: MessagesRequest,
        chat: ChatCompletionRequest | CompletionRequest,
    ) -> AsyncIterator[str]:
        return MessageStream(chat).events(stream)


def _blocks(answer: ChatAnswer) -> list[ContentBlock]:
    blocks: list[ContentBlock] = []
    if answer.reasoning:
        blocks.append(ThinkingBlock(thinking=answer.reasoning))
    if answer.content or not answer.tool_calls:
        blocks.append(TextBlock(text=answer.content))
    for call in answer.tool_calls:
        blocks.append(
            ToolUseBlock(id=call.id or _id("toolu"), name=call.name, input=_input(call.arguments))
        )
    return blocks


class MessageStream:
    """The Messages events of one streamed request, built from its chat stream: one content block
    at a time (thinking, text, then each tool call), as Anthropic streams them."""

    def __init__(self, chat: ChatCompletionRequest | CompletionRequest) -> None:
        self.chat = chat
        self.index = -1
        self.open: str | None = None  # "thinking", "text" or "call<k>"

    def _event(self, type_: str, **fields: Any) -> str:
        return event(type_, StreamEvent(type=type_, **fields).model_dump(mode="json"))

    def _switch(self, key: str, block: dict[str, Any]) -> list[str]:
        """Stop the open block (if another) and start ``block``."""
        if self.open == key:
            return []
        out = self._stop()
        self.index += 1
        self.open = key
        out.append(self._event("content_block_start", index=self.index, content_block=block))
        return out

    def _stop(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [self._event("content_block_stop", index=self.index)]

    async def events(self, stream: EventStream) -> AsyncIterator[str]:
        started = False
        usage = None
        finish, record = None, None
        async for delta in chat_chunks(stream):
            if not started:
                started = True
                yield self._start(delta.model)
            if delta.error is not None:
                message = str(delta.error.get("message"))
                yield self._event("error", error={"type": "api_error", "message": message})
                return
            usage = delta.usage or usage
            if delta.reasoning:
                for ev in self._switch(
                    "thinking", {"type": "thinking", "thinking": "", "signature": ""}
                ):
                    yield ev
                yield self._event(
                    "content_block_delta",
                    index=self.index,
                    delta={"type": "thinking_delta", "thinking": delta.reasoning},
                )
            if delta.content:
                for ev in self._switch("text", {"type": "text", "text": ""}):
                    yield ev
                yield self._event(
                    "content_block_delta",
                    index=self.index,
                    delta={"type": "text_delta", "text": delta.content},
                )
            for tc in delta.tool_calls:
                fn = tc.get("function") or {}
                key = f"call{int(tc.get('index') or 0)}"
                block = {
                    "type": "tool_use",
                    "id": str(tc.get("id") or _id("toolu")),
                    "name": str(fn.get("name") or ""),
                    "input": {},
                }
                for ev in self._switch(key, block):
                    yield ev
                if fn.get("arguments"):
                    yield self._event(
                        "content_block_delta",
                        index=self.index,
                        delta={"type": "input_json_delta", "partial_json": fn["arguments"]},
                    )
            if delta.finish_reason is not None:
                finish, record = delta.finish_reason, delta.uncertainty
        if not started:
            yield self._start(None)
        if self.index < 0:  # an empty answer is still a text block
            for ev in self._switch("text", {"type": "text", "text": ""}):
                yield ev
        for ev in self._stop():
            yield ev
        counts = usage_counts(usage)
        yield self._event(
            "message_delta",
            delta={
                "stop_reason": STOP_REASONS.get(finish or "stop", "end_turn"),
                "stop_sequence": None,
            },
            usage={
                "output_tokens": counts[1] if counts else 0,
                **({"input_tokens": counts[0]} if counts else {}),
            },
            uncertainty=record,
        )
        yield self._event("message_stop")

    def _start(self, model: str | None) -> str:
        message = MessageObject(
            id=_id("msg"),
            model=model or self.chat.model or "",
            content=[],
            stop_reason=None,
            usage=Usage(input_tokens=0, output_tokens=0),
        )
        return self._event("message_start", message=message.model_dump(mode="json"))
