"""``POST /v1/responses``: the OpenAI Responses API, served through the chat-completions path.

A request becomes a chat-completions request (``instructions`` the system message, ``input`` the
messages, function tools and ``function_call``/``function_call_output`` items their chat shapes,
``include: ["message.output_text.logprobs"]`` log-probs), the service answers it with its G-NLL and
policy (:mod:`gnll.serving.translation`), and the answer comes back as output items: a
``reasoning`` item with a reasoning model's trace, a ``message`` item with the answer text (its
``output_text`` with log-probs when asked for), a ``function_call`` item per tool call. Every output
item carries the answer's ``uncertainty`` record (the G-NLL is the answer's given the trace, as on
chat), and the ``X-Uncertainty-*`` headers are those of chat. gnll stores no responses:
``previous_response_id`` is refused, ``store`` is ignored.

A stream sends the Responses events: ``response.created``, ``response.in_progress``, per item
``response.output_item.added`` and its deltas (``response.reasoning_text.delta``,
``response.output_text.delta``, ``response.function_call_arguments.delta``), then, when the answer's
record is known, each item's ``.done`` events (``response.output_item.done`` with the record) and
``response.completed`` (``response.incomplete`` when cut at ``max_output_tokens``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from gnll.serving.protocol.common import TokenLogprob
from gnll.serving.protocol.responses import (
    FunctionCallItem,
    MessageItem,
    OutputItem,
    OutputText,
    ReasoningItem,
    ReasoningText,
    ResponseObject,
    ResponsesRequest,
    StreamEvent,
    Usage,
)
from gnll.serving.schemas import ChatCompletionRequest, CompletionRequest
from gnll.serving.translation import (
    ChatAnswer,
    ChatToolCall,
    EventStream,
    Translated,
    chat_chunks,
    event,
    usage_counts,
)


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def token_logprobs(content: list[dict[str, Any]]) -> list[TokenLogprob]:
    """Chat ``logprobs.content`` entries as Responses ``output_text`` log-probs."""
    return [TokenLogprob.model_validate(entry) for entry in content]


class ResponsesAPI(Translated[ResponsesRequest]):
    """The ``/v1/responses`` route (:class:`~gnll.serving.translation.TranslatedAPI`)."""

    route: ClassVar[str] = "/v1/responses"
    name: ClassVar[str] = "responses"
    request_model = ResponsesRequest

    def chat_options(self, request: ResponsesRequest) -> dict[str, Any]:
        logprobs = request.wants_logprobs
        return {
            "model": request.model,
            "max_tokens": request.max_output_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "user": request.user,
            "tools": request.chat_tools(),
            "tool_choice": request.chat_tool_choice(),
            "parallel_tool_calls": request.parallel_tool_calls if request.tools else None,
            "response_format": request.chat_response_format(),
            "reasoning_effort": (request.reasoning or {}).get("effort"),
            "logprobs": True if logprobs else None,
            "top_logprobs": (request.top_logprobs or 0) if logprobs else None,
        }

    def error_body(
        self, message: str, type_: str, param: str | None, code: str | None
    ) -> dict[str, Any]:
        from gnll.serving.responses import error_body

        return error_body(message, type_, param=param, code=code)

    def error_of(self, body: dict[str, Any]) -> dict[str, Any]:
        return body  # the chat error envelope is the Responses API's too

    def body(
        self,
        body: dict[str, Any],
        request: ResponsesRequest,
        chat: ChatCompletionRequest | CompletionRequest,
    ) -> dict[str, Any]:
        answer = ChatAnswer.of_body(body)
        resp = _response(request, body.get("model") or chat.model or "", _id("resp"))
        resp.output = _items(answer, request.wants_logprobs, "completed")
        _finish(resp, answer.finish_reason, usage_counts(body.get("usage")), answer)
        return resp.model_dump(mode="json")

    def events(
        self,
        stream: EventStream,
        request: ResponsesRequest,
        chat: ChatCompletionRequest | CompletionRequest,
    ) -> AsyncIterator[str]:
        return ResponseStream(request, chat).events(stream)


def _response(request: ResponsesRequest, model: str, rid: str) -> ResponseObject:
    return ResponseObject(
        id=rid,
        created_at=time.time(),
        status="in_progress",
        model=model,
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        top_logprobs=request.top_logprobs,
        tools=list(request.tools or []),
        tool_choice=request.tool_choice or "auto",
        parallel_tool_calls=request.parallel_tool_calls is not False,
        metadata=dict(request.metadata or {}),
    )


def _items(
    answer: ChatAnswer, logprobs: bool, status: Any, ids: dict[str, str] | None = None
) -> list[OutputItem]:
    """The output items of one answer, each with its ``uncertainty`` record."""
    ids = ids or {}
    rec = {"uncertainty": answer.uncertainty} if answer.uncertainty is not None else {}
    items: list[OutputItem] = []
    if answer.reasoning:
        items.append(
            ReasoningItem(
                id=ids.get("reasoning") or _id("rs"),
                content=[ReasoningText(text=answer.reasoning)],
                status=status,
                **rec,
            )
        )
    if answer.content or not answer.tool_calls:
        text = OutputText(
            text=answer.content, logprobs=token_logprobs(answer.logprobs) if logprobs else None
        )
        items.append(
            MessageItem(id=ids.get("message") or _id("msg"), status=status, content=[text], **rec)
        )
    for call in answer.tool_calls:
        items.append(
            FunctionCallItem(
                id=ids.get(f"call{call.index}") or _id("fc"),
                call_id=call.id or _id("call"),
                name=call.name,
                arguments=call.arguments,
                status=status,
                **rec,
            )
        )
    return items


def _finish(
    resp: ResponseObject,
    finish_reason: str | None,
    counts: tuple[int, int] | None,
    answer: ChatAnswer,
) -> None:
    cut = finish_reason == "length"
    resp.status = "incomplete" if cut else "completed"
    resp.incomplete_details = {"reason": "max_output_tokens"} if cut else None
    if cut:
        for item in resp.output:
            item.status = "incomplete"
    if counts is not None:
        prompt, done = counts
        trace = (answer.uncertainty or {}).get("trace_tokens") or 0
        resp.usage = Usage(
            input_tokens=prompt,
            output_tokens=done,
            total_tokens=prompt + done,
            output_tokens_details={"reasoning_tokens": int(trace)},
        )


class ResponseStream:
    """The Responses events of one streamed request, built from its chat stream."""

    def __init__(
        self, request: ResponsesRequest, chat: ChatCompletionRequest | CompletionRequest
    ) -> None:
        self.request, self.chat = request, chat
        self.seq = 0
        self.answer = ChatAnswer()
        #: output index of each open item: "reasoning", "message", "call<k>"
        self.index: dict[str, int] = {}
        self.ids: dict[str, str] = {}
        self.resp = _response(request, chat.model or "", _id("resp"))

    def _event(self, type_: str, **fields: Any) -> str:
        ev = StreamEvent(type=type_, sequence_number=self.seq, **fields)
        self.seq += 1
        return event(type_, ev.model_dump(mode="json"))

    def _open(self, key: str, item: OutputItem) -> str:
        self.index[key] = len(self.index)
        self.ids[key] = item.id
        return self._event(
            "response.output_item.added",
            output_index=self.index[key],
            item=item.model_dump(mode="json"),
        )

    def _snapshot(self) -> dict[str, Any]:
        return self.resp.model_dump(mode="json")

    async def events(self, stream: EventStream) -> AsyncIterator[str]:
        logprobs = self.request.wants_logprobs
        usage = None
        started = False
        async for delta in chat_chunks(stream):
            if not started:  # after the first chunk, which names the model that answers
                started = True
                self.resp.model = delta.model or self.resp.model
                yield self._event("response.created", response=self._snapshot())
                yield self._event("response.in_progress", response=self._snapshot())
            if delta.error is not None:
                yield self._event(
                    "error",
                    message=str(delta.error.get("message")),
                    code=delta.error.get("code") or delta.error.get("type"),
                    param=delta.error.get("param"),
                )
                return
            usage = delta.usage or usage
            if delta.reasoning:
                if "reasoning" not in self.index:
                    yield self._open("reasoning", ReasoningItem(id=_id("rs"), status="in_progress"))
                self.answer.reasoning = (self.answer.reasoning or "") + delta.reasoning
                yield self._event(
                    "response.reasoning_text.delta",
                    item_id=self.ids["reasoning"],
                    output_index=self.index["reasoning"],
                    content_index=0,
                    delta=delta.reasoning,
                )
            if delta.content:
                for ev in self._ensure_message():
                    yield ev
                self.answer.content += delta.content
                self.answer.logprobs.extend(delta.logprobs)
                yield self._event(
                    "response.output_text.delta",
                    item_id=self.ids["message"],
                    output_index=self.index["message"],
                    content_index=0,
                    delta=delta.content,
                    logprobs=_delta_logprobs(delta.logprobs) if logprobs else [],
                )
            for tc in delta.tool_calls:
                for ev in self._tool_delta(tc):
                    yield ev
            if delta.finish_reason is not None:
                self.answer.finish_reason = delta.finish_reason
                self.answer.uncertainty = delta.uncertainty
        if not started:
            yield self._event("response.created", response=self._snapshot())
        for ev in self._close(usage):
            yield ev

    def _ensure_message(self) -> list[str]:
        if "message" in self.index:
            return []
        item = MessageItem(id=_id("msg"), status="in_progress", content=[])
        part = OutputText(text="", logprobs=[] if self.request.wants_logprobs else None)
        return [
            self._open("message", item),
            self._event(
                "response.content_part.added",
                item_id=item.id,
                output_index=self.index["message"],
                content_index=0,
                part=part.model_dump(mode="json"),
            ),
        ]

    def _tool_delta(self, tc: dict[str, Any]) -> list[str]:
        k = int(tc.get("index") or 0)
        key = f"call{k}"
        fn = tc.get("function") or {}
        out = []
        if key not in self.index:
            call = ChatToolCall(k, str(tc.get("id") or _id("call")), str(fn.get("name") or ""))
            self.answer.tool_calls.append(call)
            item = FunctionCallItem(
                id=_id("fc"), call_id=call.id, name=call.name, arguments="", status="in_progress"
            )
            out.append(self._open(key, item))
        call = next(c for c in self.answer.tool_calls if c.index == k)
        piece = str(fn.get("arguments") or "")
        if piece:
            call.arguments += piece
            out.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=self.ids[key],
                    output_index=self.index[key],
                    delta=piece,
                )
            )
        return out

    def _close(self, usage: dict[str, Any] | None) -> list[str]:
        """The ``.done`` events of every item (now that the record is known) and the last event."""
        out = []
        if "message" not in self.index and not self.answer.tool_calls:
            out.extend(self._ensure_message())  # an empty answer is still a message
        status = "incomplete" if self.answer.finish_reason == "length" else "completed"
        items = _items(self.answer, self.request.wants_logprobs, status, self.ids)
        for item in items:
            key = next(k for k, v in self.ids.items() if v == item.id)
            i = self.index[key]
            if isinstance(item, ReasoningItem):
                out.append(
                    self._event(
                        "response.reasoning_text.done",
                        item_id=item.id,
                        output_index=i,
                        content_index=0,
                        text=self.answer.reasoning or "",
                    )
                )
            elif isinstance(item, MessageItem):
                part = item.content[0].model_dump(mode="json")
                out.append(
                    self._event(
                        "response.output_text.done",
                        item_id=item.id,
                        output_index=i,
                        content_index=0,
                        text=item.content[0].text,
                        logprobs=part.get("logprobs") or [],
                    )
                )
                out.append(
                    self._event(
                        "response.content_part.done",
                        item_id=item.id,
                        output_index=i,
                        content_index=0,
                        part=part,
                    )
                )
            else:
                out.append(
                    self._event(
                        "response.function_call_arguments.done",
                        item_id=item.id,
                        output_index=i,
                        arguments=item.arguments,
                    )
                )
            out.append(
                self._event(
                    "response.output_item.done", output_index=i, item=item.model_dump(mode="json")
                )
            )
        items.sort(key=lambda it: self.index[next(k for k, v in self.ids.items() if v == it.id)])
        self.resp.output = items
        _finish(self.resp, self.answer.finish_reason, usage_counts(usage), self.answer)
        kind = "response.incomplete" if self.resp.status == "incomplete" else "response.completed"
        out.append(self._event(kind, response=self._snapshot()))
        return out


def _delta_logprobs(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat log-prob entries as a Responses delta's ``logprobs`` (token, logprob, top_logprobs)."""
    return [
        {
            "token": e["token"],
            "logprob": e["logprob"],
            "top_logprobs": [
                {"token": t["token"], "logprob": t["logprob"]} for t in e.get("top_logprobs") or []
            ],
        }
        for e in content
    ]
