"""Request bodies of the OpenAI API that ``gnll serve`` accepts, validated at the boundary.

Only the fields gnll can honour are typed; unknown fields are kept (``extra="allow"``) so a proxy can
forward vendor extensions unchanged. Sampling options that would change the distribution the
log-probs describe (``top_p``, penalties, ``logit_bias``) are accepted only at their neutral values
by the in-process model (see :func:`gnll.serving.inprocess.generation_config`).

Examples
--------
>>> req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Hi"}])
>>> req.greedy, req.max_tokens is None
(True, True)
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=64)
    stop: str | list[str] | None = None
    stream: bool = False
    seed: int | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_non_empty(cls, v: str | list[str] | None) -> str | list[str] | None:
        items = [v] if isinstance(v, str) else (v or [])
        if any(not s for s in items):
            raise ValueError("stop sequences must be non-empty strings")
        if len(items) > 8:
            raise ValueError("at most 8 stop sequences")
        return v

    @property
    def greedy(self) -> bool:
        """Greedy decoding: temperature 0 or unset (gnll's default, unlike OpenAI's 1.0)."""
        return not self.temperature

    @property
    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def max_tokens_requested(self) -> int | None:
        return self.max_tokens


class CompletionRequest(_Request):
    """``POST /v1/completions``: ``prompt`` is raw text (no chat template), or a list of them."""

    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _prompt_non_empty(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list) and not v:
            raise ValueError("prompt list is empty")
        return v

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    @property
    def num_top_logprobs(self) -> int:
        return int(self.logprobs or 0)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The message text; multi-part content keeps its text parts only."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = [p.get("text", "") for p in self.content if p.get("type") == "text"]
        if len(parts) != len(self.content):
            raise ValueError("only text content parts are supported")
        return "".join(parts)


class ChatCompletionRequest(_Request):
    """``POST /v1/chat/completions``: the model's chat template renders ``messages``."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def max_tokens_requested(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.logprobs)

    @property
    def num_top_logprobs(self) -> int:
        return int(self.top_logprobs or 0)
