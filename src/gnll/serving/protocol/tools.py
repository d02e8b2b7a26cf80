"""The typed shapes of OpenAI's tool calls and structured outputs on ``/v1/chat/completions``.

``tools``, ``tool_choice``, ``parallel_tool_calls`` and ``response_format`` as a request sends
them (:class:`ToolRequest`, :class:`ResponseFormat`), and the ``tool_calls`` of an assistant
message as a response carries them (:func:`tool_call_message`, :func:`tool_call_deltas`).

>>> t = ToolRequest.of({"tools": [{"type": "function", "function": {"name": "f"}}],
...                     "tool_choice": {"type": "function", "function": {"name": "f"}}})
>>> t.required, [f["name"] for f in t.allowed_functions()]
(True, ['f'])
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gnll.serving.errors import RequestError

__all__ = [
    "FunctionDef",
    "ResponseFormat",
    "ToolDef",
    "ToolRequest",
    "call_id",
    "function_tools",
    "named_choice",
    "tool_call_deltas",
    "tool_call_message",
]


class FunctionDef(BaseModel):
    """A function a tool offers: its name, what it does, its parameters' JSON schema."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: Literal["function"]
    function: FunctionDef


class _Named(BaseModel):
    name: str


class NamedChoice(BaseModel):
    type: Literal["function"]
    function: _Named


class ToolRequest(BaseModel):
    """What a request asks of tools: the tools, which call is wanted, and how many."""

    tools: list[ToolDef] = Field(min_length=1)
    tool_choice: Literal["none", "auto", "required"] | NamedChoice = "auto"
    parallel_tool_calls: bool = True

    @classmethod
    def of(cls, data: dict[str, Any]) -> ToolRequest | None:
        """The request's tool fields (``None`` when it offers no tool, or ``tool_choice`` is
        ``"none"``: a free-text answer), or a :class:`RequestError` naming what is wrong."""
        if data.get("functions") or data.get("function_call"):
            raise RequestError(
                "functions/function_call are the deprecated form: send tools and tool_choice",
                "functions",
            )
        if not data.get("tools"):
            if data.get("tool_choice") not in (None, "none", "auto"):
                raise RequestError("tool_choice needs tools", "tool_choice")
            return None
        try:
            req = cls.model_validate(
                {k: data[k] for k in ("tools", "tool_choice", "parallel_tool_calls") if k in data}
            )
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ()))
            raise RequestError(f"invalid request: {where}: {err.get('msg')}", where) from None
        names = [t.function.name for t in req.tools]
        if len(set(names)) != len(names):
            raise RequestError("two tools have the same function name", "tools")
        if isinstance(req.tool_choice, NamedChoice) and req.tool_choice.function.name not in names:
            raise RequestError(
                f"tool_choice names {req.tool_choice.function.name!r}, which is not among the tools",
                "tool_choice",
            )
        return None if req.tool_choice == "none" else req

    @property
    def required(self) -> bool:
        """Whether the answer must be a call (``"required"`` or a named function)."""
        return self.tool_choice != "auto"

    @property
    def names(self) -> list[str]:
        return [t.function.name for t in self.tools]

    def allowed_functions(self) -> list[dict[str, Any]]:
        """The ``function`` objects a call may name (one, under a named ``tool_choice``)."""
        fns = [t.function.model_dump(exclude_none=True) for t in self.tools]
        if isinstance(self.tool_choice, NamedChoice):
            return [f for f in fns if f["name"] == self.tool_choice.function.name]
        return fns

    def tool_dicts(self) -> list[dict[str, Any]]:
        return [t.model_dump(exclude_none=True) for t in self.tools]


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """``response_format``: free text, any JSON object, or JSON under a schema."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @classmethod
    def of(cls, data: dict[str, Any]) -> ResponseFormat | None:
        """The request's JSON format (``None``: free text), or a :class:`RequestError`."""
        raw = data.get("response_format")
        if raw is None:
            return None
        try:
            fmt = cls.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(["response_format", *(str(p) for p in err.get("loc", ()))])
            raise RequestError(f"invalid request: {where}: {err.get('msg')}", where) from None
        if fmt.type == "json_schema" and fmt.json_schema is None:
            raise RequestError(
                "response_format json_schema needs its json_schema", "response_format"
            )
        return None if fmt.type == "text" else fmt

    def json_schema_of(self) -> dict[str, Any] | None:
        """The JSON schema the answer must satisfy (``None``: any JSON object)."""
        return self.json_schema.schema_ if self.json_schema is not None else None


def function_tools(functions: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Function declarations as chat ``tools`` (what the translated APIs ask the chat path with).

    >>> function_tools([{"name": "f"}])
    [{'type': 'function', 'function': {'name': 'f'}}]
    """
    return [{"type": "function", "function": f} for f in functions]


def named_choice(name: str | None) -> dict[str, Any]:
    """The chat ``tool_choice`` that names one function."""
    return {"type": "function", "function": {"name": name}}


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_call_message(calls: Sequence[tuple[str, str, str]], content: str | None) -> dict[str, Any]:
    """An assistant message with ``tool_calls``: ``calls`` are ``(id, name, arguments JSON)``."""
    return {
        "role": "assistant",
        "content": content or None,
        "refusal": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ],
    }


def tool_call_deltas(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The stream ``delta`` objects that spell ``message``'s tool calls, in OpenAI's order: per
    call, its id, type and name with empty arguments, then the arguments."""
    out: list[dict[str, Any]] = []
    for k, call in enumerate(message.get("tool_calls") or []):
        fn = call["function"]
        out.append(
            {
                "tool_calls": [
                    {
                        "index": k,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": fn["name"], "arguments": ""},
                    }
                ]
            }
        )
        out.append({"tool_calls": [{"index": k, "function": {"arguments": fn["arguments"]}}]})
    return out


def arguments_json(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, ensure_ascii=False)
