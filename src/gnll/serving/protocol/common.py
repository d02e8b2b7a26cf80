"""What the OpenAI APIs share: the request base, usage, log-prob entries, and :class:`Shape`, the one
place where an API's wire form is known.

A request class names its shape (``ChatCompletionRequest.shape`` is :data:`~.chat.CHAT`); the
services ask the shape for bodies, chunks and log-probs, so no serving module tells the APIs apart by
a flag. Adding an API is one protocol module (its request, response and chunk models), one
:class:`Shape` subclass and a route (docs/architecture.md, "Add an endpoint").

The models are dumped in field order, which is the order of the keys on the wire: a field is listed
where OpenAI's own responses put it.

Examples
--------
>>> Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5).model_dump()
{'prompt_tokens': 3, 'completion_tokens': 2, 'total_tokens': 5}
"""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, field_validator

from gnll.backends.base import GenerationConfig
from gnll.serving.errors import RequestError
from gnll.uncertainty import Uncertainty

if TYPE_CHECKING:
    from gnll.backends.openai.servers import ServerProfile
    from gnll.serving.responses import Answer

__all__ = [
    "OpenAIRequest",
    "Record",
    "RecordOrJSON",
    "Shape",
    "StreamOptions",
    "TokenLogprob",
    "TopLogprob",
    "UNBOUNDED",
    "Usage",
    "Chunk",
    "ChunkChoiceBase",
    "Response",
    "dump",
    "new_id",
]


def _record_json(value: Uncertainty | dict[str, Any] | None) -> dict[str, Any] | None:
    return value.to_json() if isinstance(value, Uncertainty) else value


#: A choice's ``uncertainty``: the typed record, sent as its JSON (:meth:`Uncertainty.to_json`:
#: the fields that say nothing left out); a record already in JSON is sent as it is.
Record = Annotated[Uncertainty, PlainSerializer(_record_json)]
RecordOrJSON = Annotated[Uncertainty | dict[str, Any] | None, PlainSerializer(_record_json)]


#: ``max_new_tokens`` of a request that gnll does not bound (a proxy's: the upstream's limit
#: applies there).
UNBOUNDED = 2**31 - 1


def new_id(prefix: str) -> str:
    """A response id as OpenAI forms them (``chatcmpl-…``, ``cmpl-…``)."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


class Usage(BaseModel):
    """``usage``: the prompt's and the answers' token counts."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, prompt_tokens: int, answers: Sequence[Answer]) -> Usage:
        """The usage of ``answers`` (each its ``completion_tokens``, else its token count)."""
        done = sum(
            a.completion_tokens if a.completion_tokens is not None else len(a.tokens)
            for a in answers
        )
        return cls(
            prompt_tokens=prompt_tokens, completion_tokens=done, total_tokens=prompt_tokens + done
        )


class TopLogprob(BaseModel):
    """One alternative of a chat log-prob entry."""

    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    """One chat log-prob entry (``logprobs.content[i]``): the token and its alternatives."""

    top_logprobs: list[TopLogprob]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class OpenAIRequest(BaseModel):
    """What every request shares; the API itself is told by its :attr:`shape`, never by testing
    which class a request is."""

    model_config = ConfigDict(extra="allow")

    #: The wire form of this API's responses and chunks.
    shape: ClassVar[Shape]
    #: The route under ``/v1``, as an upstream server has it too.
    path: ClassVar[str]

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

    @property
    def wants_logprobs(self) -> bool:
        raise NotImplementedError

    @property
    def num_top_logprobs(self) -> int:
        raise NotImplementedError

    @property
    def num_prompts(self) -> int:
        """How many prompts the request holds (its answers are ``num_prompts * n``)."""
        return 1

    def prompt_format(self, chat_format: str) -> str:
        raise NotImplementedError

    def prompt_text(self) -> str:
        raise NotImplementedError

    def model_prompts(self, chat_format: str) -> tuple[list[Any], bool]:
        raise NotImplementedError

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


class Response(BaseModel):
    """What every API's whole response has, in the order OpenAI sends it (each API's model names
    its ``object`` and its choices)."""

    id: str
    object: str
    created: int
    model: str | None
    choices: Sequence[BaseModel]
    usage: Usage


class Chunk(Response):
    """What every API's stream chunk has (a usage only in a stream's usage chunk)."""

    usage: Usage | dict[str, Any] | None = None  # type: ignore[assignment]


class ChunkChoiceBase(BaseModel):
    """A chunk choice: a piece of text, or (the last) the finish reason and the record; each API
    adds where its text goes."""

    index: int
    logprobs: dict[str, Any] | None
    finish_reason: str | None
    uncertainty: RecordOrJSON = None


def dump(model: BaseModel) -> dict[str, Any]:
    """A model gnll built, as JSON: only what was set (a field OpenAI leaves out, such as a
    message's ``reasoning``, stays out), in field order."""
    return model.model_dump(exclude_unset=True)


class Shape(ABC):
    """The wire form of one API: how its bodies, chunks and log-probs look, built and read.

    One instance per API (:data:`~.chat.CHAT`, :data:`~.completions.COMPLETIONS`). Bodies and
    chunks gnll builds itself are typed models dumped to JSON objects; an upstream's bodies are
    read and edited here (their keys kept as the upstream sent them).
    """

    #: The ``id`` prefix of a response.
    id_prefix: ClassVar[str]
    #: The ``object`` of a whole response and of a stream chunk.
    object: ClassVar[str]
    chunk_object: ClassVar[str]
    #: The whole response's model, its choices' and its chunk choices'.
    response_model: ClassVar[type[Response]]
    choice_model: ClassVar[type[BaseModel]]
    chunk_choice_model: ClassVar[type[ChunkChoiceBase]]

    def new_id(self) -> str:
        return new_id(self.id_prefix)

    def chunk_base(
        self, model: str | None, *, id: str | None = None, created: int | None = None
    ) -> dict[str, Any]:
        """The fields every chunk of one stream shares."""
        return {
            "id": id or self.new_id(),
            "object": self.chunk_object,
            "created": created or int(time.time()),
            "model": model,
        }

    # -- responses gnll builds ---------------------------------------------------------------
    def body(
        self,
        req: OpenAIRequest,
        model: str,
        answers: Sequence[Answer],
        texts: Sequence[str],
        finishes: Sequence[str | None],
        records: Sequence[Uncertainty],
        *,
        prompt_tokens: int,
    ) -> dict[str, Any]:
        """The whole response to ``req``: one choice per answer, each with its record (and its
        log-probs when asked for, unless the answer was refused: they would describe the text
        that was withheld)."""
        choices = [
            self.choice_model(
                index=i,
                logprobs=self.logprobs(a, req.num_top_logprobs)
                if req.wants_logprobs and not rec.refused
                else None,
                finish_reason=finish,
                uncertainty=rec,
                **self.answer_fields(a, text, rec),
            )
            for i, (a, text, finish, rec) in enumerate(
                zip(answers, texts, finishes, records, strict=True)
            )
        ]
        response = self.response_model(
            id=self.new_id(),
            object=self.object,
            created=int(time.time()),
            model=model,
            choices=choices,
            usage=Usage.of(prompt_tokens, answers),
        )
        return dump(response)

    @staticmethod
    @abstractmethod
    def logprobs(answer: Answer, top: int) -> BaseModel:
        """An answer's ``logprobs`` (with ``top`` alternatives per token) in this API's shape."""

    @abstractmethod
    def answer_fields(self, answer: Answer, text: str, record: Uncertainty) -> dict[str, Any]:
        """Where a whole response's choice carries its answer (chat: ``message``)."""

    @abstractmethod
    def chunk_text(self, text: str | None) -> dict[str, Any]:
        """Where a chunk choice carries a piece of text (``None``: a last chunk's, none)."""

    @abstractmethod
    def opening(self, index: int) -> dict[str, Any] | None:
        """The chunk choice that opens a streamed choice (chat: the assistant's role), if any."""

    @abstractmethod
    def carried(self, index: int, choice: dict[str, Any]) -> dict[str, Any] | None:
        """The chunk choice, if any, that carries a replayed ``choice``'s fields besides its
        text (chat: a reasoning trace, tool calls), sent before the text."""

    def piece(self, index: int, text: str, logprobs: dict[str, Any] | None) -> dict[str, Any]:
        """The chunk choice of one piece of text."""
        fields = self.chunk_text(text)
        return dump(
            self.chunk_choice_model(index=index, logprobs=logprobs, finish_reason=None, **fields)
        )

    def last(
        self, index: int, finish: str | None, record: Uncertainty | dict[str, Any] | None
    ) -> dict[str, Any]:
        """The last chunk choice of a choice: its finish reason and its ``uncertainty``
        (a record, or its JSON)."""
        model = self.chunk_choice_model
        fields = self.chunk_text(None)
        return dump(
            model(index=index, logprobs=None, finish_reason=finish, uncertainty=record, **fields)
        )

    @abstractmethod
    def piece_logprobs(self, answer: Answer, offset: int, top: int = 0) -> dict[str, Any]:
        """The log-probs of a streamed piece (``answer``: its tokens, and their alternatives when
        ``top``), text offsets from ``offset``."""

    # -- bodies read and edited (gnll's own or an upstream's) --------------------------------
    @abstractmethod
    def text_of(self, choice: dict[str, Any]) -> str:
        """The answer text of one ``choices[i]`` of a response body."""

    @abstractmethod
    def set_text(self, choice: dict[str, Any], text: str) -> None:
        """Replace the answer text of one ``choices[i]`` (the policy's text)."""

    def decorate(
        self,
        choice: dict[str, Any],
        record: Uncertainty,
        text: str,
        finish: str | None,
        *,
        keep_logprobs: bool,
    ) -> None:
        """Put the record, the policy's text and finish reason on an upstream's ``choice``; drop
        log-probs the client did not ask for (or that describe a withheld text)."""
        choice["uncertainty"] = record.to_json()
        choice["finish_reason"] = finish
        self.set_text(choice, text)
        if not keep_logprobs or record.refused:
            choice["logprobs"] = None

    def own_body(self, data: dict[str, Any]) -> dict[str, Any]:
        """An upstream body with the fields a replay reads, filled if absent."""
        return {
            "id": data.get("id") or self.new_id(),
            "created": data.get("created") or int(time.time()),
            "model": data.get("model"),
            "choices": data["choices"],
            "usage": data.get("usage"),
        }

    @abstractmethod
    def whole_choice(self, text: str) -> dict[str, Any]:
        """What a whole response's choice holds besides ``index`` / ``finish_reason`` /
        ``logprobs``: its text."""

    @abstractmethod
    def slice_logprobs(self, logprobs: dict[str, Any], t: int) -> dict[str, Any]:
        """The log-probs of token ``t`` of a body's ``logprobs``, as a chunk carries them."""

    @abstractmethod
    def delta_texts(self, choice: dict[str, Any]) -> tuple[str, str | None]:
        """The answer text and the reasoning text of one streamed chunk choice."""

    # -- requests sent upstream ----------------------------------------------------------------
    @abstractmethod
    def ask_logprobs(
        self, body: dict[str, Any], req: OpenAIRequest, profile: ServerProfile
    ) -> None:
        """Switch on the per-token log-probs G-NLL needs in an upstream request body."""

    @abstractmethod
    def max_tokens_key(self, profile: ServerProfile) -> str:
        """The upstream's name for the token limit."""
