"""Prompt formats: how what a user gives (a question, chat turns, text) becomes a model's prompt.

Every gnll surface names one of three formats, and reports it with its numbers, because the
same answer has a different G-NLL under a different prompt:

``instruction``
    gnll's question-answering instruction around a question (what ``gnll ask`` sends; ``gnll
    eval`` adds its few-shot blocks), given to the model as user text (its chat template, if any).
``chat``
    Chat turns (``[{"role": ..., "content": ...}]``, or a string as one user turn) rendered by the
    model's own chat template (:meth:`~gnll.backends.base.Model.render_chat`), with nothing added.
``text``
    The exact text the model conditions on: no template, nothing added.

Calibration files record the format they were fitted on; applying one to answers produced under
another format is refused (:mod:`gnll.calibration`).

>>> print(instruction_prompt("What is the capital of France?"))
Answer the following question as briefly as possible.
Question: What is the capital of France?
Answer:
>>> prompt, raw = prompt_for("Hi?", "chat")
>>> prompt.messages, raw
(({'role': 'user', 'content': 'Hi?'},), False)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, get_args

from gnll.backends.base import ChatPrompt

__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "BRIEF_LONG",
    "BRIEF_SHORT",
    "PROMPT_FORMATS",
    "PromptFormat",
    "check_format",
    "instruction_prompt",
    "prompt_for",
    "question_block",
]

PromptFormat = Literal["instruction", "chat", "text"]
PROMPT_FORMATS: tuple[str, ...] = get_args(PromptFormat)

#: The instruction lines of the paper's short- and long-answer prompts.
BRIEF_SHORT = "Answer the following question as briefly as possible."
BRIEF_LONG = "Answer the following question in a single brief but complete sentence."
#: The greedy answer's token cap when none is given, by ``long`` (a sentence needs more than a
#: few words): ``gnll ask``, ``gnll score --with-greedy``, ``gnll generate`` and the vLLM greedy stage.
DEFAULT_MAX_NEW_TOKENS = {False: 50, True: 100}


def check_format(value: str) -> PromptFormat:
    """``value`` as a :data:`PromptFormat`, or a ``ValueError`` naming the formats."""
    if value not in PROMPT_FORMATS:
        raise ValueError(
            f"unknown prompt format {value!r}; choose one of {', '.join(PROMPT_FORMATS)}"
        )
    return value  # type: ignore[return-value]


def question_block(question: str, *, context: str | None = None) -> str:
    """``[Context: ..\\n]Question: ..\\nAnswer:``, the block every instruction prompt ends with."""
    head = f"Context: {context}\n" if context else ""
    return f"{head}Question: {question}\nAnswer:"


def instruction_prompt(question: str, *, long: bool = False) -> str:
    """The ``instruction`` format's zero-shot prompt (``gnll ask``): instruction line, question."""
    return (BRIEF_LONG if long else BRIEF_SHORT) + "\n" + question_block(question)


def prompt_for(
    value: str | Sequence[Mapping[str, str]], prompt_format: str, *, long: bool = False
) -> tuple[str, bool]:
    """``(prompt, raw_prompt)`` to give :meth:`Model.generate`/:meth:`Model.score` for ``value``.

    ``value`` is a question (``instruction``), chat turns or a string as one user turn
    (``chat``), or the exact text (``text``). ``long`` picks the long-answer instruction.
    """
    fmt = check_format(prompt_format)
    if fmt == "chat":
        if isinstance(value, ChatPrompt):
            return value, False
        turns = [{"role": "user", "content": value}] if isinstance(value, str) else value
        return ChatPrompt.of([dict(t) for t in turns]), False
    if not isinstance(value, str):
        raise TypeError(f"a {fmt!r} prompt is a string, got {type(value).__name__}")
    if fmt == "instruction":
        return instruction_prompt(value, long=long), False
    return value, True
