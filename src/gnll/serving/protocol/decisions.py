"""The OpenAI Decisions API (``POST /v1/decisions``): request and response models.

The shapes are the openai SDK's (``openai.types.decision_create_params`` and
``openai.types.decision``): a request asks predicate, choice and score questions about an
``input``; the response holds one answer per question, in order (a predicate's probability, a
choice and its option probabilities, a score's expected level and its level probabilities, or a
refusal), and the token usage.

gnll adds, on each answer: every option's ``logprob``, ``nll`` and ``num_tokens`` (beside its
``probability``), the options' raw total probability ``mass``, the ``method`` the numbers come
from (``exact``: every token of every option teacher-forced; ``first-token``: the first token
only, when asked for through ``first_token``), the calibrated ``p_correct`` and the threshold's
``guarantee`` when the server has a decisions calibration, and a refusal's ``reason``. The request
takes two extensions (``extra_body`` in the SDK): ``first_token`` and ``min_mass``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

__all__ = [
    "ChoiceAnswer",
    "ChoiceQuestion",
    "DecisionRequest",
    "DecisionResponse",
    "Guarantee",
    "OptionProbability",
    "PredicateAnswer",
    "PredicateQuestion",
    "RefusalAnswer",
    "ScoreAnswer",
    "ScoreQuestion",
    "Usage",
]

Instructions = str | list[dict[str, Any]]


class _Question(BaseModel):
    model_config = ConfigDict(extra="forbid")

    instructions: Instructions
    name: str | None = None


class PredicateQuestion(_Question):
    """How likely a statement about the input is true."""

    type: Literal["predicate"]


class ChoiceOption(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: StrictStr | StrictBool
    description: str | None = None


class ChoiceQuestion(_Question):
    """Choose one of the supplied values (2 to 255, each unique)."""

    type: Literal["choice"]
    choices: list[ChoiceOption] = Field(min_length=2, max_length=255)


class Level(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str
    description: str | None = None


class ScoreQuestion(_Question):
    """Rate the input against ordered levels (indexed from 0)."""

    type: Literal["score"]
    levels: list[Level] = Field(min_length=2)


Question = Annotated[
    PredicateQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")
]


class DecisionRequest(BaseModel):
    """The body of ``POST /v1/decisions`` (unknown fields are refused, so a typo is not ignored)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: str | list[dict[str, Any]]
    questions: list[Question] = Field(min_length=1, max_length=400)
    # accepted for compatibility; a local model has no prompt cache to partition
    prompt_cache_key: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    #: gnll: through a proxy whose upstream cannot teacher-force, answer from the first token's
    #: scores (labelled ``method: first-token``) instead of refusing.
    first_token: bool = False
    #: gnll: refuse a question whose options cover less than this much of the model's probability.
    min_mass: float = Field(default=0.0, ge=0.0, lt=1.0)


class OptionProbability(BaseModel):
    """One option's probability among the options, and gnll's numbers behind it."""

    value: StrictBool | StrictInt | StrictStr
    probability: float
    label: str | None = None
    logprob: float | None = None
    nll: float | None = None
    num_tokens: int | None = None


class Guarantee(BaseModel):
    """What the calibrated threshold guarantees (``gnll serve --calibration`` with a decisions file)."""

    threshold: float | None
    alpha: float
    delta: float
    n_calibration: int
    calibration_accuracy: float | None = None
    calibration_coverage: float | None = None
    method: str
    statement: str


class _Answer(BaseModel):
    name: str | None = None
    probabilities: list[OptionProbability] | None = None
    mass: float | None = None
    method: Literal["exact", "first-token"] | None = None
    p_correct: float | None = None
    guarantee: Guarantee | None = None


class PredicateAnswer(_Answer):
    type: Literal["predicate"]
    probability: float


class ChoiceAnswer(_Answer):
    type: Literal["choice"]
    choice: StrictBool | StrictStr
    confidence: float


class ScoreAnswer(_Answer):
    type: Literal["score"]
    score: float
    confidence: float


class RefusalAnswer(_Answer):
    """A question not answered, with the reason (its numbers, when there are some, are kept)."""

    type: Literal["refusal"]
    reason: str
    question_type: Literal["predicate", "choice", "score"]


Answer = Annotated[
    PredicateAnswer | ChoiceAnswer | ScoreAnswer | RefusalAnswer, Field(discriminator="type")
]


class InputTokensDetails(BaseModel):
    cache_write_tokens: int = 0
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class Usage(BaseModel):
    """Token usage: ``input_tokens`` counts the prompt and option tokens the model was run on."""

    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class DecisionResponse(BaseModel):
    """The response: answers in question order, the model, the usage."""

    model: str
    answers: list[Answer]
    usage: Usage

    def to_json(self) -> dict[str, Any]:
        """The body: fields gnll has no value for are left out, but every answer keeps its
        ``name`` (``null`` for an unnamed question), as the API does."""
        body = self.model_dump(exclude_none=True)
        for answer, typed in zip(body["answers"], self.answers, strict=True):
            answer.setdefault("name", typed.name)
        return body
