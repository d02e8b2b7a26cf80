"""The Anthropic Messages API (``POST /v1/messages``) as gnll serves it: request, response and event
models.

Only what gnll honours is typed; unknown request fields are kept (``extra="allow"``) and ignored
(``metadata``, ``service_tier``, ``thinking``: a reasoning model's trace comes back as a
``thinking`` block either way). Image and document blocks are refused with a 400 naming the
field, and so is ``top_k`` (it warps the distribution the log-probs describe). The message carries
an extra field, ``uncertainty``: the answer's record, as on a chat choice.

Examples
--------
>>> req = MessagesRequest.model_validate({
...     "model": "m", "max_tokens": 16, "system": "Be brief.",
...     "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]})
>>> [(m["role"], m["content"]) for m in req.chat_messages()]
[('system', 'Be brief.'), ('user', 'Hi')]
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gnll.serving.errors import RequestError
from gnll.serving.protocol.tools import function_tools, named_choice

#: chat-completions ``finish_reason`` -> Messages ``stop_reason``.
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class InputMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class MessagesRequest(BaseModel):
    """``POST /v1/messages`` (the fields gnll reads; see the module docstring)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[InputMessage] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None

    def check_supported(self) -> None:
        """Refuse (:class:`RequestError`) what gnll cannot honour (see the module docstring)."""
        if self.top_k is not None:
            raise RequestError(
                "top_k is not supported: log-probs are reported under the full distribution",
                "top_k",
            )
        for tool in self.tools or []:
            if "input_schema" not in tool:
                raise RequestError(
                    f"tools of type {tool.get('type')!r} are not supported: only custom tools "
                    "with an input_schema",
                    "tools",
                )

    def chat_messages(self) -> list[dict[str, Any]]:
        """``system`` and ``messages`` as chat-completions messages: ``tool_use`` blocks become an
        assistant message's ``tool_calls``, ``tool_result`` blocks ``tool`` messages."""
        out: list[dict[str, Any]] = []
        if self.system:
            system = self.system
            if not isinstance(system, str):
                system = "".join(_text_of(b, "system") for b in system)
            out.append({"role": "system", "content": system})
        for i, message in enumerate(self.messages):
            if isinstance(message.content, str):
                out.append({"role": message.role, "content": message.content})
                continue
            texts: list[str] = []
            calls: list[dict[str, Any]] = []
            for j, block in enumerate(message.content):
                kind = block.get("type")
                where = f"messages.{i}.content.{j}"
                if kind == "text":
                    texts.append(block.get("text", ""))
                elif kind == "tool_use" and message.role == "assistant":
                    arguments = json.dumps(block.get("input") or {})
                    calls.append(
                        {
                            "id": block.get("id"),
                            "type": "function",
                            "function": {"name": block.get("name"), "arguments": arguments},
                        }
                    )
                elif kind == "tool_result" and message.role == "user":
                    content = block.get("content")
                    if not isinstance(content, str):
                        content = "".join(_text_of(b, where) for b in content or [])
                    out.append(
                        {
                            "role": "tool",
                            "tool_call_id": block.get("tool_use_id"),
                            "content": content,
                        }
                    )
                elif kind in ("thinking", "redacted_thinking"):
                    continue  # an earlier turn's trace: chat templates drop it too
                else:
                    raise RequestError(
                        f"content blocks of type {kind!r} are not supported in a "
                        f"{message.role} message",
                        where,
                    )
            if texts or (calls and message.role == "assistant"):
                entry: dict[str, Any] = {"role": message.role, "content": "".join(texts) or None}
                if calls:
                    entry["tool_calls"] = calls
                out.append(entry)
        return out

    def chat_tools(self) -> list[dict[str, Any]] | None:
        """Tools in the chat-completions shape."""
        if not self.tools:
            return None
        return function_tools(
            {
                "name": t.get("name"),
                **({"description": t["description"]} if "description" in t else {}),
                "parameters": t.get("input_schema") or {},
            }
            for t in self.tools
        )

    def chat_tool_choice(self) -> str | dict[str, Any] | None:
        """``tool_choice`` in the chat-completions shape."""
        choice = self.tool_choice
        if choice is None:
            return None
        kind = choice.get("type")
        if kind == "tool":
            return named_choice(choice.get("name"))
        return {"auto": "auto", "any": "required", "none": "none"}.get(str(kind), "auto")


def _text_of(block: dict[str, Any], where: str) -> str:
    if block.get("type") != "text":
        raise RequestError(f"content blocks of type {block.get('type')!r} are not supported", where)
    return str(block.get("text", ""))


class TextBlock(_Wire):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(_Wire):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class ThinkingBlock(_Wire):
    """A reasoning model's trace (the G-NLL is the answer's, given this trace). gnll signs nothing:
    ``signature`` is empty."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""


ContentBlock = TextBlock | ToolUseBlock | ThinkingBlock


class Usage(_Wire):
    input_tokens: int
    output_tokens: int


class MessageObject(_Wire):
    """The response (``type: "message"``); ``uncertainty`` rides as an extra field."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ContentBlock]
    stop_reason: str | None
    stop_sequence: str | None = None
    usage: Usage


class StreamEvent(_Wire):
    """One server-sent event of a ``stream: true`` message (``message_start``,
    ``content_block_start``, ``content_block_delta``, ``content_block_stop``, ``message_delta``,
    ``message_stop``, ``error``)."""

    type: str


def error_body(message: str, type_: str) -> dict[str, Any]:
    """Anthropic's error envelope (what the ``anthropic`` SDK reads an error's message from)."""
    return {"type": "error", "error": {"type": type_, "message": message}}
