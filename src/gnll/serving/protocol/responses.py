"""The OpenAI Responses API (``POST /v1/responses``) as gnll serves it: request, response and event
models.

Only what gnll honours is typed; unknown request fields are kept (``extra="allow"``) and ignored,
as the Responses API has many options that do not change a free-text answer (``store``,
``truncation``, ``service_tier``, ...). What gnll cannot honour is refused with a 400 naming the
field: ``previous_response_id`` and ``item_reference`` inputs (gnll stores no responses: send the
conversation in ``input``), ``background``, ``conversation``, ``prompt`` templates and built-in
tools (web search, file search, ...). The output models carry extra fields (``extra="allow"``): every
output item of an answer gets that answer's ``uncertainty`` record.

Examples
--------
>>> req = ResponsesRequest.model_validate({"model": "m", "input": "Hi", "instructions": "Be brief."})
>>> [(m["role"], m["content"]) for m in req.chat_messages()]
[('system', 'Be brief.'), ('user', 'Hi')]
>>> ResponsesRequest(input="x", include=["message.output_text.logprobs"]).wants_logprobs
True
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gnll.serving.errors import RequestError
from gnll.serving.protocol.common import TokenLogprob
from gnll.serving.protocol.tools import function_tools, named_choice

#: ``include`` value that asks for the answer's token log-probs on each ``output_text`` part.
LOGPROBS_INCLUDE = "message.output_text.logprobs"

#: Request fields gnll cannot honour, with why (400 naming the field).
REFUSED = {
    "previous_response_id": "gnll serve does not store responses: send the whole conversation "
    "in input",
    "conversation": "gnll serve does not store conversations: send the whole conversation in input",
    "background": "background responses are not supported: gnll serve stores no responses",
    "prompt": "stored prompt templates are not supported: send the prompt in input",
}


class _Wire(BaseModel):
    """Output shapes: extra fields (``uncertainty``) ride along, as OpenAI's own types allow."""

    model_config = ConfigDict(extra="allow")


class ResponsesRequest(BaseModel):
    """``POST /v1/responses`` (the fields gnll reads; see the module docstring)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool = False
    include: list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None

    @property
    def wants_logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or [])

    def check_supported(self) -> None:
        """Refuse (:class:`RequestError`) what gnll cannot honour (see the module docstring)."""
        extra = self.model_extra or {}
        for name, why in REFUSED.items():
            if extra.get(name):
                raise RequestError(f"{name} is not supported: {why}", name)
        for tool in self.tools or []:
            if tool.get("type") != "function":
                raise RequestError(
                    f"tools of type {tool.get('type')!r} are not supported: only function tools",
                    "tools",
                )

    def chat_messages(self) -> list[dict[str, Any]]:
        """``instructions`` and ``input`` as chat-completions messages (items in order; a run of
        ``function_call`` items becomes one assistant message with ``tool_calls``)."""
        out: list[dict[str, Any]] = []
        if self.instructions:
            out.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            out.append({"role": "user", "content": self.input})
            return out
        for i, item in enumerate(self.input):
            kind = item.get("type", "message")
            if kind == "message":
                out.append({"role": item.get("role", "user"), "content": _item_text(item, i)})
            elif kind == "function_call":
                call = {
                    "id": item.get("call_id") or item.get("id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
                }
                last = out[-1] if out else None
                if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                    last["tool_calls"].append(call)
                else:
                    out.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "function_call_output":
                output = item.get("output")
                text = output if isinstance(output, str) else json.dumps(output)
                out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
            elif kind == "reasoning":
                continue  # an earlier turn's trace: chat templates drop it too
            elif kind == "item_reference":
                raise RequestError(
                    "item_reference inputs are not supported: gnll serve stores no responses; "
                    "send the items themselves",
                    f"input.{i}",
                )
            else:
                raise RequestError(f"input items of type {kind!r} are not supported", f"input.{i}")
        return out

    def chat_tools(self) -> list[dict[str, Any]] | None:
        """Function tools in the chat-completions shape."""
        if not self.tools:
            return None
        keys = ("name", "description", "parameters", "strict")
        return function_tools({k: t[k] for k in keys if k in t} for t in self.tools)

    def chat_tool_choice(self) -> str | dict[str, Any] | None:
        """``tool_choice`` in the chat-completions shape."""
        choice = self.tool_choice
        if isinstance(choice, dict) and choice.get("type") == "function":
            return named_choice(choice.get("name"))
        return choice

    def chat_response_format(self) -> dict[str, Any] | None:
        """``text.format`` as a chat ``response_format`` (``None``: plain text)."""
        fmt = (self.text or {}).get("format")
        if not fmt or fmt.get("type") == "text":
            return None
        if fmt.get("type") == "json_schema":
            schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
            return {"type": "json_schema", "json_schema": schema}
        return dict(fmt)


def _item_text(item: dict[str, Any], i: int) -> str:
    content = item.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.get("type") not in ("input_text", "output_text", "text"):
            raise RequestError(
                f"content parts of type {part.get('type')!r} are not supported: text only",
                f"input.{i}.content",
            )
        texts.append(part.get("text", ""))
    return "".join(texts)


class OutputText(_Wire):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[TokenLogprob] | None = None


class MessageItem(_Wire):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class FunctionCallItem(_Wire):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class ReasoningText(_Wire):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(_Wire):
    """A reasoning model's trace (gnll's G-NLL is the answer's, given this trace)."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = []
    content: list[ReasoningText] = []
    status: Literal["in_progress", "completed", "incomplete"] | None = None


OutputItem = MessageItem | FunctionCallItem | ReasoningItem


class Usage(_Wire):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: dict[str, int] = {"cached_tokens": 0, "cache_write_tokens": 0}
    output_tokens_details: dict[str, int] = {"reasoning_tokens": 0}


class ResponseObject(_Wire):
    """The ``response`` object (``object: "response"``)."""

    id: str
    object: Literal["response"] = "response"
    created_at: float
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    model: str
    output: list[OutputItem] = []
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] = []
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    metadata: dict[str, str] = {}
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    usage: Usage | None = None
    previous_response_id: None = None
    store: bool = False


class StreamEvent(_Wire):
    """One event of a ``stream: true`` response: ``type`` and ``sequence_number`` and the fields
    that type has (``response``, ``item``, ``part``, ``delta``, ...)."""

    type: str
    sequence_number: int
