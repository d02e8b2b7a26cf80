"""``/v1/chat/completions``: the request, the response and the stream chunk, and :data:`CHAT`, its
shape.

Examples
--------
>>> req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Hi"}])
>>> req.shape is CHAT, req.greedy, req.max_tokens is None
(True, True, True)
>>> CHAT.piece(0, "Hi", None)
{'index': 0, 'logprobs': None, 'finish_reason': None, 'delta': {'content': 'Hi'}}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from gnll.backends.base import ChatPrompt
from gnll.backends.openai.parse import logprob_entries
from gnll.backends.prompting import prompt_for
from gnll.serving.errors import RequestError
from gnll.serving.protocol.common import (
    Chunk,
    ChunkChoiceBase,
    OpenAIRequest,
    Record,
    Response,
    Shape,
    TokenLogprob,
    TopLogprob,
    dump,
)
from gnll.uncertainty import Uncertainty

if TYPE_CHECKING:
    from gnll.backends.openai.servers import ServerProfile
    from gnll.serving.responses import Answer

__all__ = [
    "CHAT",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatMessage",
    "ChatShape",
    "chat_prompt",
]


# ---------------------------------------------------------------------------------- request
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


class ChatCompletionRequest(OpenAIRequest):
    """``POST /v1/chat/completions``: the model's chat template renders ``messages``."""

    shape: ClassVar[Shape]
    path: ClassVar[str] = "/chat/completions"

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

    def model_prompts(self, chat_format: str) -> tuple[list[Any], bool]:
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


# ---------------------------------------------------------------------------------- response
class ChatLogprobs(BaseModel):
    """A choice's ``logprobs``: one entry per token with its top alternatives."""

    content: list[TokenLogprob]
    refusal: None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None
    #: A reasoning model's trace, where vLLM's reasoning parsers put it.
    reasoning: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    uncertainty: Record


class ChatCompletion(Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


# ---------------------------------------------------------------------------------- chunks
class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkOpening(BaseModel):
    """A streamed choice's first chunk choice: the assistant's role."""

    index: int
    delta: Delta
    logprobs: None = None
    finish_reason: None = None


class ChunkChoice(ChunkChoiceBase):
    delta: Delta


class ChatCompletionChunk(Chunk):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChunkChoice | ChunkOpening]


def _other_fields(message: dict[str, Any]) -> dict[str, Any]:
    """A message's fields besides ``role`` and ``content`` (``reasoning``, ``reasoning_content``,
    ``tool_calls``, vendor fields), as one delta: a replay carries all that a live stream would.

    >>> _other_fields({"role": "assistant", "content": "4", "reasoning": "2+2", "refusal": None})
    {'reasoning': '2+2'}
    """
    extra = {k: v for k, v in message.items() if k not in ("role", "content") and v is not None}
    calls = extra.get("tool_calls")
    if isinstance(calls, list):  # a stream's tool calls carry their position
        extra["tool_calls"] = [
            {"index": n, **c} if isinstance(c, dict) and "index" not in c else c
            for n, c in enumerate(calls)
        ]
    return extra


class ChatShape(Shape):
    """Chat completions: ``message`` / ``delta`` choices and ``logprobs.content`` entries."""

    id_prefix = "chatcmpl"
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"
    response_model = ChatCompletion
    choice_model = ChatChoice
    chunk_choice_model = ChunkChoice

    @staticmethod
    def logprobs(answer: Answer, top: int) -> ChatLogprobs:
        """Chat ``logprobs``: one ``content`` entry per token with its top alternatives."""
        content = []
        for t, (tok, lp) in enumerate(zip(answer.tokens, answer.token_logprobs, strict=True)):
            alts = []
            if top and answer.top_logprobs is not None:
                alts = [
                    TopLogprob(token=k, logprob=v, bytes=list(k.encode()))
                    for k, v in list(answer.top_logprobs[t].items())[:top]
                ]
            content.append(
                TokenLogprob(token=tok, logprob=lp, bytes=list(tok.encode()), top_logprobs=alts)
            )
        return ChatLogprobs(content=content, refusal=None)

    def answer_fields(self, answer: Answer, text: str, record: Uncertainty) -> dict[str, Any]:
        message = AssistantMessage(role="assistant", content=text, refusal=None)
        trace = getattr(answer.reasoning, "trace_text", None)
        if trace is not None and not record.refused:
            # A refused answer's trace is withheld with it.
            message.reasoning = trace
        return {"message": message}

    def chunk_text(self, text: str | None) -> dict[str, Any]:
        return {"delta": Delta() if text is None else Delta(content=text)}

    def opening(self, index: int) -> dict[str, Any] | None:
        opening = ChunkOpening(
            index=index,
            delta=Delta(role="assistant", content=""),
            logprobs=None,
            finish_reason=None,
        )
        return dump(opening)

    def carried(self, index: int, choice: dict[str, Any]) -> dict[str, Any] | None:
        """The delta of a replayed choice's message fields besides its content (a reasoning
        trace, tool calls, vendor fields), sent before the answer as a live stream would."""
        extra = _other_fields(choice["message"])
        if not extra:
            return None
        return {"index": index, "delta": extra, "logprobs": None, "finish_reason": None}

    def piece_logprobs(self, answer: Answer, offset: int, top: int = 0) -> dict[str, Any]:
        return dump(self.logprobs(answer, top))

    def text_of(self, choice: dict[str, Any]) -> str:
        return str((choice.get("message") or {}).get("content") or "")

    def set_text(self, choice: dict[str, Any], text: str) -> None:
        if isinstance(choice.get("message"), dict):
            choice["message"]["content"] = text

    def whole_choice(self, text: str) -> dict[str, Any]:
        return {"message": {"role": "assistant", "content": text}}

    def slice_logprobs(self, logprobs: dict[str, Any], t: int) -> dict[str, Any]:
        return {"content": logprob_entries(logprobs)[t : t + 1], "refusal": None}

    def delta_texts(self, choice: dict[str, Any]) -> tuple[str, str | None]:
        from gnll.backends.openai.reasoning import reasoning_text

        delta = choice.get("delta") or {}
        return delta.get("content") or "", reasoning_text(delta) or ""

    def ask_logprobs(
        self, body: dict[str, Any], req: OpenAIRequest, profile: ServerProfile
    ) -> None:
        # Alternatives only where the upstream needs one to report log-probs at all
        # (llama-cpp-python's chat) or the client asked: they cost the upstream time.
        least = 1 if profile.logprobs_need_top else 0
        body["logprobs"] = True
        if max(req.num_top_logprobs, least):
            body["top_logprobs"] = max(req.num_top_logprobs, least)

    def max_tokens_key(self, profile: ServerProfile) -> str:
        return profile.max_tokens_key


#: The shape of chat completions.
CHAT = ChatShape()
ChatCompletionRequest.shape = CHAT
