"""``/v1/completions``: the request, the response and the stream chunk, and :data:`COMPLETIONS`, its
shape.

Examples
--------
>>> req = CompletionRequest(model="m", prompt=["a", "b"], logprobs=2)
>>> req.shape is COMPLETIONS, req.num_prompts, req.num_top_logprobs
(True, 2, 2)
>>> COMPLETIONS.piece(0, "Hi", None)
{'index': 0, 'logprobs': None, 'finish_reason': None, 'text': 'Hi'}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, Field, field_validator

from gnll.serving.errors import RequestError
from gnll.serving.protocol.common import (
    Chunk,
    ChunkChoiceBase,
    OpenAIRequest,
    Record,
    Response,
    Shape,
    dump,
)
from gnll.uncertainty import Uncertainty

if TYPE_CHECKING:
    from gnll.backends.openai.servers import ServerProfile
    from gnll.serving.responses import Answer

__all__ = [
    "COMPLETIONS",
    "Completion",
    "CompletionChunk",
    "CompletionLogprobs",
    "CompletionRequest",
    "CompletionShape",
]


# ---------------------------------------------------------------------------------- request
class CompletionRequest(OpenAIRequest):
    """``POST /v1/completions``: ``prompt`` is raw text (no chat template), or a list of them."""

    shape: ClassVar[Shape]
    path: ClassVar[str] = "/completions"

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

    def model_prompts(self, chat_format: str) -> tuple[list[Any], bool]:
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


# ---------------------------------------------------------------------------------- response
class CompletionLogprobs(BaseModel):
    """Legacy completions ``logprobs``: parallel lists of tokens, log-probs and text offsets."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    uncertainty: Record


class Completion(Response):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


# ---------------------------------------------------------------------------------- chunks
class CompletionChunkChoice(ChunkChoiceBase):
    text: str


class CompletionChunk(Chunk):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChunkChoice]


class CompletionShape(Shape):
    """Legacy completions: ``text`` choices and parallel ``tokens`` / ``token_logprobs`` lists."""

    id_prefix = "cmpl"
    object = "text_completion"
    chunk_object = "text_completion"
    response_model = Completion
    choice_model = CompletionChoice
    chunk_choice_model = CompletionChunkChoice

    @staticmethod
    def logprobs(answer: Answer, top: int) -> CompletionLogprobs:
        offsets, pos = [], 0
        for tok in answer.tokens:
            offsets.append(pos)
            pos += len(tok)
        tops = None
        if top and answer.top_logprobs is not None:
            tops = [dict(list(t.items())[:top]) for t in answer.top_logprobs]
        return CompletionLogprobs(
            tokens=list(answer.tokens),
            token_logprobs=list(answer.token_logprobs),
            top_logprobs=tops,
            text_offset=offsets,
        )

    def answer_fields(self, answer: Answer, text: str, record: Uncertainty) -> dict[str, Any]:
        return {"text": text}

    def chunk_text(self, text: str | None) -> dict[str, Any]:
        return {"text": text or ""}

    def opening(self, index: int) -> dict[str, Any] | None:
        return None

    def carried(self, index: int, choice: dict[str, Any]) -> dict[str, Any] | None:
        return None

    def piece_logprobs(self, answer: Answer, offset: int, top: int = 0) -> dict[str, Any]:
        lp = dump(self.logprobs(answer, top))
        lp["text_offset"] = [offset + o for o in lp["text_offset"]]
        return lp

    def text_of(self, choice: dict[str, Any]) -> str:
        return str(choice.get("text") or "")

    def set_text(self, choice: dict[str, Any], text: str) -> None:
        choice["text"] = text

    def whole_choice(self, text: str) -> dict[str, Any]:
        return {"text": text}

    def slice_logprobs(self, logprobs: dict[str, Any], t: int) -> dict[str, Any]:
        return {k: (v[t : t + 1] if isinstance(v, list) else v) for k, v in logprobs.items()}

    def delta_texts(self, choice: dict[str, Any]) -> tuple[str, str | None]:
        return choice.get("text") or "", None

    def ask_logprobs(
        self, body: dict[str, Any], req: OpenAIRequest, profile: ServerProfile
    ) -> None:
        body["logprobs"] = max(req.num_top_logprobs, 1 if profile.logprobs_need_top else 0)
        for k, v in profile.extras.items():
            body.setdefault(k, v)

    def max_tokens_key(self, profile: ServerProfile) -> str:
        return "max_tokens"


#: The shape of legacy completions.
COMPLETIONS = CompletionShape()
CompletionRequest.shape = COMPLETIONS
