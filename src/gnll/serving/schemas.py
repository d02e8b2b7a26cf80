"""Request bodies of the OpenAI API that ``gnll serve`` accepts, validated at the boundary.

Only the fields gnll can honour are typed; unknown fields are kept (``extra="allow"``) so a proxy can
forward vendor extensions unchanged. Options that change what an answer *is* (``tools``,
``functions``, a ``response_format`` other than text) are refused with a 400 in both modes: G-NLL is
computed for a free-text answer. Sampling options that would change the distribution the log-probs
describe (``top_p``, penalties, ``logit_bias``) are accepted only at their neutral values by the
in-process model (:meth:`_Request.check_unwarped`).

A request becomes a :class:`~gnll.backends.base.GenerationConfig` in one place,
:meth:`_Request.generation_config` (vLLM's ``to_sampling_params``), for both modes.

Examples
--------
>>> req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Hi"}])
>>> req.greedy, req.max_tokens is None
(True, True)
>>> req.generation_config(default_max_tokens=16, max_tokens_limit=64).max_new_tokens
16
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gnll.backends.base import ChatPrompt, GenerationConfig
from gnll.backends.prompting import prompt_for
from gnll.serving.errors import RequestError

#: ``max_new_tokens`` of a request that gnll does not bound (a proxy's: the upstream's limit
#: applies there).
UNBOUNDED = 2**31 - 1

#: Request fields that ask for something other than a free-text answer (refused with a 400).
UNSUPPORTED = ("tools", "tool_choice", "functions", "function_call", "parallel_tool_calls")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


def check_free_text(data: dict[str, Any]) -> None:
    """Refuse (400) a raw request body that asks for something other than a free-text answer."""
    for name in UNSUPPORTED:
        value = data.get(name)
        if value and value != "none":  # an empty list, false or "none" asks for nothing
            raise RequestError(f"{name} is not supported: gnll serve answers in free text", name)
    fmt = data.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise RequestError(
            'response_format is not supported (only {"type": "text"}): gnll serve answers in '
            "free text",
            "response_format",
        )


class _Request(BaseModel):
    """What both kinds of request share; the kind itself is told by the class (``is_chat``,
    ``path``) and its methods, never by testing which class a request is."""

    model_config = ConfigDict(extra="allow")

    #: ``/v1/chat/completions`` (messages, ``delta`` chunks) or ``/v1/completions`` (raw text).
    is_chat: ClassVar[bool]
    #: The route under ``/v1``, as an upstream server has it too.
    path: ClassVar[str]
    #: The ``id`` prefix and ``object`` of a response.
    id_prefix: ClassVar[str]

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
    stream_options: StreamOptions | None = None

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

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk (``stream_options.include_usage``, as OpenAI)."""
        return bool(self.stream_options and self.stream_options.include_usage)

    def generation_config(
        self, *, default_max_tokens: int | None, max_tokens_limit: int | None
    ) -> GenerationConfig:
        """The decoding this request asks for, or a :class:`RequestError` naming what is refused.

        Both modes call it: the token limit and greedy's single answer are checked here once.
        ``None`` bounds (a proxy's, unless set): the upstream's own default and limit apply, and
        the config's ``max_new_tokens`` is :data:`UNBOUNDED` (nothing gnll enforces).
        """
        max_tokens = self.max_tokens_requested() or default_max_tokens or UNBOUNDED
        if max_tokens_limit is not None and max_tokens > max_tokens_limit:
            raise RequestError(
                f"max_tokens={max_tokens} is above this server's limit of {max_tokens_limit} "
                "(gnll serve --max_tokens_limit raises it)",
                "max_tokens",
            )
        if self.greedy:
            if self.n != 1:
                raise RequestError(
                    "n > 1 needs temperature > 0: greedy decoding has one answer", "n"
                )
            return GenerationConfig.greedy(max_new_tokens=max_tokens, stop=self.stop_list)
        return GenerationConfig.sample(
            self.n,
            temperature=float(self.temperature or 0.0),
            max_new_tokens=max_tokens,
            stop=self.stop_list,
            seed=self.seed,
        )

    def check_unwarped(self) -> None:
        """Refuse (400) options that warp the distribution the in-process log-probs describe."""
        if self.top_p is not None and self.top_p != 1.0:
            raise RequestError(
                "top_p < 1 is not supported: log-probs are reported under the full distribution",
                "top_p",
            )
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise RequestError(f"{name} is not supported by the in-process model", name)
        if self.logit_bias:
            raise RequestError("logit_bias is not supported by the in-process model", "logit_bias")
        if getattr(self, "echo", False):
            raise RequestError(
                "echo is not supported; use `gnll score` to score given text", "echo"
            )


class CompletionRequest(_Request):
    """``POST /v1/completions``: ``prompt`` is raw text (no chat template), or a list of them."""

    is_chat: ClassVar[bool] = False
    path: ClassVar[str] = "/completions"
    id_prefix: ClassVar[str] = "cmpl"

    #: Text, texts, or token ids (one list or several: vLLM's, which gnll's server backend sends
    #: once it has rendered a chat prompt through ``/tokenize``); an in-process model takes text.
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _prompt_non_empty(
        cls, v: str | list[str] | list[int] | list[list[int]]
    ) -> str | list[str] | list[int] | list[list[int]]:
        if isinstance(v, list) and not v:
            raise ValueError("prompt list is empty")
        if isinstance(v, list) and any(isinstance(p, list) and not p for p in v):
            raise ValueError("a token-id prompt is empty")
        return v

    @property
    def token_ids(self) -> bool:
        """Whether the prompts are token ids (forwarded by a proxy; refused in-process)."""
        return isinstance(self.prompt, list) and not isinstance(self.prompt[0], str)

    @property
    def prompts(self) -> list[str]:
        """The prompts as text (token-id prompts as ``<N token ids>``, for counting and logs)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p[0], int):
            return [f"<{len(p)} token ids>"]
        return [x if isinstance(x, str) else f"<{len(x)} token ids>" for x in p]

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    @property
    def num_top_logprobs(self) -> int:
        return int(self.logprobs or 0)

    def prompt_format(self, chat_format: str) -> str:
        """How this request's prompt is rendered: a completion's is always the exact ``"text"``."""
        return "text"

    def model_prompts(self, chat_format: str) -> tuple[list[str], bool]:
        """The prompts for the model, and whether they are already rendered (always)."""
        if self.token_ids:
            raise RequestError(
                "prompt: token ids are not served in-process (a proxy forwards them to its "
                "upstream); send the prompt as text",
                "prompt",
            )
        return list(self.prompts), True

    @property
    def num_prompts(self) -> int:
        """How many prompts the request holds (its answers are ``num_prompts * n``)."""
        return len(self.prompts)

    def prompt_text(self) -> str:
        """The prompts as one text (the access log's ``prompt``)."""
        return "\n".join(self.prompts)

    @staticmethod
    def choice_text(choice: dict[str, Any]) -> str:
        """The answer text of one ``choices[i]`` of a response body."""
        return str(choice.get("text") or "")


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


#: Message fields besides role and content that a chat template reads (a tool-call history).
KEPT_FIELDS = ("tool_calls", "tool_call_id", "name")


def chat_prompt(messages: Sequence[ChatMessage]) -> ChatPrompt:
    """The conversation as one prompt, for the model to render (:meth:`Model.render_chat`):
    ``developer`` turns as ``system`` (as OpenAI and vLLM), tool calls and their ids kept."""
    turns = []
    for m in messages:
        extra = m.model_extra or {}
        turn: dict[str, Any] = {"role": m.role, "content": m.text()}
        turn.update({k: extra[k] for k in KEPT_FIELDS if extra.get(k) is not None})
        turns.append(turn)
    return ChatPrompt.of(turns)


class ChatCompletionRequest(_Request):
    """``POST /v1/chat/completions``: the model's chat template renders ``messages``."""

    is_chat: ClassVar[bool] = True
    path: ClassVar[str] = "/chat/completions"
    id_prefix: ClassVar[str] = "chatcmpl"

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

    def prompt_format(self, chat_format: str) -> str:
        """How this request's prompt is rendered: the server's chat format
        (:mod:`gnll.backends.prompting`)."""
        return chat_format

    def model_prompts(self, chat_format: str) -> tuple[list[str], bool]:
        """The prompt for the model in ``chat_format``, and whether it is already rendered.

        ``"chat"``: the messages as a :class:`~gnll.backends.base.ChatPrompt` the model renders
        itself; ``"instruction"``: one user message, asked as ``gnll ask`` asks a question.
        """
        if chat_format == "instruction":
            if len(self.messages) != 1 or self.messages[0].role != "user":
                raise RequestError(
                    "this server asks chat requests in the 'instruction' prompt format "
                    "(gnll serve --prompt-format instruction): send one user message, the question",
                    "messages",
                )
            prompt, raw = prompt_for(self.messages[0].text(), "instruction")
            return [prompt], raw
        try:
            return [chat_prompt(self.messages)], False
        except ValueError as exc:
            raise RequestError(str(exc), "messages") from exc

    @property
    def num_prompts(self) -> int:
        """One conversation: one prompt."""
        return 1

    def prompt_text(self) -> str:
        """The messages' texts as one text (the access log's ``prompt``)."""
        return "\n".join(m.text() for m in self.messages)

    @staticmethod
    def choice_text(choice: dict[str, Any]) -> str:
        """The answer text of one ``choices[i]`` of a response body."""
        return str((choice.get("message") or {}).get("content") or "")
