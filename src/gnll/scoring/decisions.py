"""``gnll.decide``: typed decisions about an input, with exact probabilities of every option.

A decision question offers a finite set of answers: a *predicate* the options ``true`` and
``false``, a *choice* its values, a *score* its ordered levels. Each option's probability is the
teacher-forced sequence probability of its text as the model's answer to the question about the
input (:func:`gnll.score`: every token of the option, however many), renormalised over the
options. With a finite set of answers the most likely one and its probability are computed
exactly, by scoring every option; no greedy search and no first-token shortcut.

Each answer also reports the options' raw total probability (``mass``: how much of the model's
probability the options cover; a small mass is a reason to refuse, ``min_mass``) and each option's
NLL, the number ``gnll score`` gives that option as the answer to the same messages
(:func:`question_messages`). A question that cannot be answered is a refusal with its reason; the
other questions are still answered.

All the options of all the questions about one input are scored in one call, so the backend runs
the prompt they share (the input) once (the transformers backend's shared-prefix prefill).

Example::

    from gnll import decide, load_model
    model = load_model("smollm2-135m-instruct")
    d = decide(model, "Stripe has failed to connect for three days. Help ASAP.", [
        {"type": "predicate", "name": "urgent", "instructions": "Is this request urgent?"},
        {"type": "choice", "name": "team", "instructions": "Which team should handle it?",
         "choices": [{"value": "billing"}, {"value": "technical support"}]},
    ])
    d.answers[1].choice, d.answers[1].probabilities   # exact, renormalised over the two options
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy.special import logsumexp

from gnll.backends.base import Model, ScoredAnswer
from gnll.scoring.api import ScoringError, score

__all__ = [
    "METHODS",
    "Decision",
    "DecisionAnswer",
    "DecisionError",
    "OptionScore",
    "Question",
    "answer_from_logprobs",
    "decide",
    "first_token_logprobs",
    "input_messages",
    "parse_questions",
    "question_messages",
]

QuestionType = Literal["predicate", "choice", "score"]
#: ``exact``: every option's whole text teacher-forced; ``first-token``: each option's first
#: token only (what single-token decision servers read; an approximation, labelled as one).
METHODS = ("exact", "first-token")
#: The most questions one request may ask (the OpenAI API's limit).
MAX_QUESTIONS = 400


class DecisionError(ValueError):
    """A request that cannot be decided at all (bad input, bad questions): not a per-question refusal."""


@dataclass(frozen=True)
class Option:
    """One answer a question offers: its typed value, the text scored, its description."""

    value: str | bool | int
    text: str
    description: str | None = None
    label: str | None = None  # a score level's label


@dataclass
class Question:
    """A parsed question: its type, name, instructions (text) and options.

    ``unanswerable`` holds the reason a question is refused before any scoring (an image in its
    instructions, two options written alike).
    """

    type: QuestionType
    name: str | None
    instructions: str
    options: list[Option]
    unanswerable: str | None = None

    def prompt_text(self) -> str:
        """The question as the model reads it after the input: instructions, options, format."""
        if self.type == "predicate":
            return f"{self.instructions}\nAnswer with exactly one word: true or false."
        head = "Options:" if self.type == "choice" else "Levels, from lowest to highest:"
        lines = [
            f"- {o.text}" + (f": {o.description}" if o.description else "") for o in self.options
        ]
        what = "option" if self.type == "choice" else "level"
        return (
            f"{self.instructions}\n{head}\n"
            + "\n".join(lines)
            + f"\nAnswer with exactly one {what}, written as above."
        )


@dataclass
class OptionScore:
    """One option's numbers: its probability among the options, log-probability and NLL."""

    value: str | bool | int
    text: str
    probability: float
    logprob: float
    nll: float
    num_tokens: int
    label: str | None = None
    #: The option's first token's log-prob (what a single-token method reads), when known.
    first_token_logprob: float | None = None


@dataclass
class DecisionAnswer:
    """The answer to one question (or its refusal).

    Attributes
    ----------
    type:
        ``predicate``, ``choice``, ``score`` or ``refusal``.
    question_type:
        The question's own type (also for a refusal).
    probability:
        Predicate: P(true). Choice and score: the chosen option's probability.
    choice:
        The most probable option's value (a predicate's: ``True`` or ``False``).
    confidence:
        How concentrated the distribution is: ``1 - H(p) / log(n)`` (1: one option has all the
        probability; 0: uniform), not the chosen option's probability.
    score:
        Score questions: the expected level index, ``sum_i p_i * i`` (levels indexed from 0).
    mass:
        The options' raw total probability under the model (before renormalising).
    options:
        Every option's :class:`OptionScore`, in the question's order.
    method:
        ``exact`` or ``first-token``.
    reason:
        Why a refusal refused.
    """

    type: str
    question_type: QuestionType
    name: str | None
    method: str = "exact"
    probability: float | None = None
    choice: str | bool | int | None = None
    confidence: float | None = None
    score: float | None = None
    mass: float | None = None
    options: list[OptionScore] = field(default_factory=list)
    reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def top_probability(self) -> float | None:
        """The chosen option's probability (a predicate's: ``max(p, 1 - p)``)."""
        if not self.options:
            return None
        return max(o.probability for o in self.options)

    def refuse(self, reason: str, **extra: Any) -> DecisionAnswer:
        """This answer turned into a refusal that keeps its numbers (a threshold's refusal)."""
        self.type, self.reason = "refusal", reason
        self.extra.update(extra)
        return self

    def to_dict(self) -> dict[str, Any]:
        """The answer in the OpenAI Decisions API's shape, plus gnll's numbers."""
        opts = [
            {
                **({"label": o.label} if o.label is not None else {}),
                "value": o.value,
                "probability": o.probability,
                "logprob": o.logprob,
                "nll": o.nll,
                "num_tokens": o.num_tokens,
            }
            for o in self.options
        ]
        out: dict[str, Any] = {"type": self.type, "name": self.name, "method": self.method}
        if self.type == "predicate":
            out["probability"] = self.probability
        elif self.type == "choice":
            out.update(choice=self.choice, confidence=self.confidence)
        elif self.type == "score":
            out.update(score=self.score, confidence=self.confidence)
        else:
            out.update(reason=self.reason, question_type=self.question_type)
        if opts:
            out["probabilities"] = opts
            out["mass"] = self.mass
        out.update(self.extra)
        return out


@dataclass
class Decision:
    """The answers to a request's questions, in question order, and the tokens scored."""

    answers: list[DecisionAnswer]
    model: str
    scored_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "answers": [a.to_dict() for a in self.answers]}


# ---------------------------------------------------------------------- input and questions
def _text_parts(content: Any, where: str) -> tuple[str, str | None]:
    """The text of a content value (a string or a list of parts), and why it cannot be read."""
    if isinstance(content, str):
        return content, None
    if not isinstance(content, list):
        raise DecisionError(f"{where} must be a string or a list of parts")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("input_text", "output_text", "text"):
            texts.append(str(part.get("text", "")))
        elif kind == "input_json":
            texts.append(json.dumps(part.get("data"), ensure_ascii=False))
        elif kind == "refusal":
            texts.append(str(part.get("refusal", "")))
        elif kind == "input_image":
            return "", f"{where} holds an image: this model reads text only"
        else:
            raise DecisionError(f"{where}: unknown part type {kind!r}")
    return "\n".join(texts), None


def input_messages(value: str | Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The decision input as chat turns: a string is one user turn; messages keep their roles
    (``developer`` becomes ``system``); tool calls and their outputs become short text turns."""
    if isinstance(value, str):
        if not value.strip():
            raise DecisionError("input is empty")
        return [{"role": "user", "content": value}]
    if not isinstance(value, Sequence) or not value:
        raise DecisionError("input must be a non-empty string or a non-empty list of items")
    turns: list[dict[str, str]] = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise DecisionError(f"input[{i}] must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "developer", "system", "assistant"):
                raise DecisionError(f"input[{i}].role must be user, developer, system or assistant")
            text, why = _text_parts(item.get("content"), f"input[{i}].content")
            if why:
                raise DecisionError(why)
            turns.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind in ("function_call", "custom_tool_call"):
            args = item.get("arguments", item.get("input", ""))
            turns.append({"role": "assistant", "content": f"[call {item.get('name')}: {args}]"})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            text, why = _text_parts(item.get("output"), f"input[{i}].output")
            if why:
                raise DecisionError(why)
            turns.append({"role": "user", "content": f"[output of {item.get('call_id')}]\n{text}"})
        else:
            raise DecisionError(f"input[{i}]: unknown item type {kind!r}")
    return turns


def _option_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_questions(questions: Sequence[Mapping[str, Any]]) -> list[Question]:
    """Questions in the OpenAI Decisions API's shape, checked (:class:`DecisionError` if not)."""
    if isinstance(questions, (str, Mapping)) or not isinstance(questions, Sequence):
        raise DecisionError("questions must be a list of question objects")
    if not 1 <= len(questions) <= MAX_QUESTIONS:
        raise DecisionError(f"ask between 1 and {MAX_QUESTIONS} questions, got {len(questions)}")
    out = []
    for i, q in enumerate(questions):
        if not isinstance(q, Mapping):
            raise DecisionError(f"questions[{i}] must be an object")
        kind = q.get("type")
        name = q.get("name")
        text, why = _text_parts(q.get("instructions"), f"questions[{i}].instructions")
        if not text.strip() and why is None:
            raise DecisionError(f"questions[{i}].instructions is empty")
        if kind == "predicate":
            options = [Option(True, "true"), Option(False, "false")]
        elif kind == "choice":
            choices = q.get("choices")
            if not isinstance(choices, list) or not 2 <= len(choices) <= 255:
                raise DecisionError(f"questions[{i}].choices: give between 2 and 255 choices")
            options = []
            for j, c in enumerate(choices):
                v = c.get("value") if isinstance(c, Mapping) else None
                if not isinstance(v, (str, bool)) or (isinstance(v, str) and not v.strip()):
                    raise DecisionError(
                        f"questions[{i}].choices[{j}].value must be a non-empty string or a boolean"
                    )
                options.append(Option(v, _option_text(v), c.get("description")))
            values = [(type(o.value), o.value) for o in options]
            if len(set(values)) != len(values):
                raise DecisionError(f"questions[{i}].choices: each choice must be unique")
        elif kind == "score":
            levels = q.get("levels")
            if not isinstance(levels, list) or len(levels) < 2:
                raise DecisionError(f"questions[{i}].levels: give at least 2 levels")
            options = []
            for j, lv in enumerate(levels):
                label = lv.get("label") if isinstance(lv, Mapping) else None
                if not isinstance(label, str) or not label.strip():
                    raise DecisionError(f"questions[{i}].levels[{j}].label must be non-empty text")
                options.append(Option(j, label, lv.get("description"), label=label))
        else:
            raise DecisionError(
                f"questions[{i}].type must be predicate, choice or score, got {kind!r}"
            )
        texts = [o.text for o in options]
        if why is None and len(set(texts)) != len(texts):
            dup = next(t for t in texts if texts.count(t) > 1)
            why = f"two options are written the same ({dup!r}): their texts cannot be told apart"
        out.append(Question(kind, name, text, options, unanswerable=why))
    return out


def question_messages(
    input: str | Sequence[Mapping[str, Any]] | list[dict[str, str]], question: Question
) -> list[dict[str, str]]:
    """The chat turns an option of ``question`` answers: the input, then the question.

    The question joins the input's last user turn (after a blank line), or is a user turn of its
    own after another role, so templates that require alternating roles take it. These are the
    ``messages`` with which ``gnll score`` gives each option's NLL.
    """
    turns = [dict(t) for t in input_messages(input)]
    block = question.prompt_text()
    if turns[-1]["role"] == "user":
        turns[-1]["content"] = f"{turns[-1]['content']}\n\n{block}"
    else:
        turns.append({"role": "user", "content": block})
    return turns


# ---------------------------------------------------------------------- answering
def _entropy_confidence(p: np.ndarray) -> float:
    nz = p[p > 0]
    h = float(-(nz * np.log(nz)).sum())
    return float(min(1.0, max(0.0, 1.0 - h / math.log(len(p)))))


def answer_from_logprobs(
    question: Question,
    logprobs: Sequence[float],
    *,
    num_tokens: Sequence[int] | None = None,
    method: str = "exact",
    min_mass: float = 0.0,
) -> DecisionAnswer:
    """The answer to ``question`` given each option's log-probability under the model.

    Probabilities are the options' probabilities renormalised over the options (in log space);
    ``mass`` is their raw total. A mass below ``min_mass``, or a log-probability that is not a
    finite number <= 0, is a refusal with its reason, never a silent number.
    """
    lp = np.asarray(logprobs, dtype=np.float64)
    if len(lp) != len(question.options):
        raise ValueError(f"{len(lp)} log-probs for {len(question.options)} options")
    base = DecisionAnswer("refusal", question.type, question.name, method=method)
    bad = [o.text for o, v in zip(question.options, lp, strict=True) if not (v <= 0.0)]
    if bad or not np.all(np.isfinite(lp)):
        which = bad or [
            o.text for o, v in zip(question.options, lp, strict=True) if not np.isfinite(v)
        ]
        return base.refuse(f"no valid log-probability for option(s) {', '.join(map(repr, which))}")
    log_mass = float(logsumexp(lp))
    p = np.exp(lp - log_mass)
    p /= p.sum()  # exp of a renormalised log-prob is off by round-off: sum exactly to 1
    mass = math.exp(log_mass)
    counts = list(num_tokens) if num_tokens is not None else [0] * len(lp)
    base.mass = mass
    base.options = [
        OptionScore(o.value, o.text, float(pi), float(v), 0.0 - float(v), int(n), o.label)
        for o, pi, v, n in zip(question.options, p, lp, counts, strict=True)
    ]
    if mass < min_mass:
        return base.refuse(
            f"the options cover {mass:.3g} of the model's probability, below the minimum "
            f"{min_mass:g}: the model would rather answer something else"
        )
    top = int(np.argmax(p))
    base.type = question.type
    base.choice = question.options[top].value
    base.confidence = _entropy_confidence(p)
    if question.type == "predicate":
        base.probability = float(p[0])  # options are (true, false)
    else:
        base.probability = float(p[top])
    if question.type == "score":
        base.score = float(np.dot(p, np.arange(len(p))))
    return base


def first_token_logprobs(
    options: Sequence[str], tops: Mapping[str, float]
) -> tuple[list[float], list[str]]:
    """Each option's first-token log-probability read from the alternatives ``tops`` (token text
    -> log-prob) at the answer position: the longest alternative the option starts with (a
    leading space ignored). Returns the log-probs and the options none of the alternatives starts.

    Options that share a first token get the same number: the single-token method cannot tell
    them apart, which is why it is only a labelled fallback.

    >>> first_token_logprobs(["Paris", "Lyon"], {"Par": -0.2, "P": -2.0, " Ly": -1.5})
    ([-0.2, -1.5], [])
    >>> first_token_logprobs(["Nice"], {"Par": -0.2})
    ([nan], ['Nice'])
    """
    out, missing = [], []
    for text in options:
        best: tuple[int, float] | None = None
        for token, lp in tops.items():
            t = token.lstrip()
            if t and text.startswith(t) and (best is None or len(t) > best[0]):
                best = (len(t), float(lp))
        if best is None:
            missing.append(text)
            out.append(math.nan)
        else:
            out.append(best[1])
    return out, missing


def _score_options(
    model: Model, prompts: list[list[dict[str, str]]], texts: list[str]
) -> list[ScoredAnswer | str]:
    """Score every (prompt, option) in one call; if the call fails, per question group, so that one
    question's failure is its refusal only. A string is that option's error."""
    try:
        return list(score(model, prompts, texts, prompt_format="chat"))
    except (ScoringError, ValueError, RuntimeError, IndexError) as exc:
        if len(texts) == 1:
            return [str(exc)]
    out: list[ScoredAnswer | str] = []
    for p, t in zip(prompts, texts, strict=True):
        out.extend(_score_options(model, [p], [t]))
    return out


def decide(
    model: Model,
    input: str | Sequence[Mapping[str, Any]],
    questions: Sequence[Mapping[str, Any]] | Sequence[Question],
    *,
    method: str = "exact",
    min_mass: float = 0.0,
) -> Decision:
    """Answer typed questions about ``input`` with every option's exact probability.

    Parameters
    ----------
    model:
        A model that can teacher-force (``capabilities.scoring``: the in-process backend, a vLLM
        server); another is refused with a :class:`~gnll.scoring.api.ScoringError` naming what is
        missing.
    input:
        Text, or a list of messages (and tool calls and outputs) in the OpenAI Decisions shape.
    questions:
        Predicate, choice and score questions in the OpenAI Decisions shape (or parsed
        :class:`Question` objects).
    method:
        ``"exact"`` (every token of every option) or ``"first-token"`` (each option's first token
        only, the single-token method, for comparison; options sharing a first token then get
        the same number).
    min_mass:
        Refuse a question whose options together have less than this raw probability.

    Returns
    -------
    Decision
        One :class:`DecisionAnswer` per question, in order; a refusal carries its reason.
    """
    if method not in METHODS:
        raise DecisionError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if not 0.0 <= min_mass < 1.0:
        raise DecisionError(f"min_mass must be in [0, 1), got {min_mass}")
    if model.capabilities.missing(["scoring"]):
        raise ScoringError(
            f"{model.name} cannot teacher-force (no prompt log-probs), so it cannot give an "
            "option's exact probability; use the in-process backend or a vLLM server"
        )
    parsed = [q if isinstance(q, Question) else None for q in questions]
    if any(q is None for q in parsed):
        parsed = parse_questions(questions)  # type: ignore[arg-type]
    qs: list[Question] = parsed  # type: ignore[assignment]
    base = input_messages(input)  # checks the input once, for every question
    prompts, texts, owner = [], [], []
    for k, q in enumerate(qs):
        if q.unanswerable:
            continue
        msgs = question_messages(base, q)
        for o in q.options:
            prompts.append(msgs)
            texts.append(o.text)
            owner.append(k)
    scored = _score_options(model, prompts, texts) if texts else []
    per_q: dict[int, list[ScoredAnswer | str]] = {}
    for k, s in zip(owner, scored, strict=True):
        per_q.setdefault(k, []).append(s)
    answers, tokens = [], 0
    for k, q in enumerate(qs):
        if q.unanswerable:
            answers.append(
                DecisionAnswer("refusal", q.type, q.name, method=method, reason=q.unanswerable)
            )
            continue
        got = per_q[k]
        errors = [s for s in got if isinstance(s, str)]
        if errors:
            answers.append(
                DecisionAnswer("refusal", q.type, q.name, method=method, reason=errors[0])
            )
            continue
        ok: list[ScoredAnswer] = got  # type: ignore[assignment]
        tokens += sum(s.num_tokens for s in ok)
        if method == "exact":
            lps = [float(np.sum(s.token_logprobs)) for s in ok]
        else:
            lps = [float(s.token_logprobs[0]) for s in ok]
        answer = answer_from_logprobs(
            q, lps, num_tokens=[s.num_tokens for s in ok], method=method, min_mass=min_mass
        )
        for o, s in zip(answer.options, ok, strict=False):  # no options: a refusal
            o.first_token_logprob = float(s.token_logprobs[0])
        answers.append(answer)
    return Decision(answers, model.name, scored_tokens=tokens)
