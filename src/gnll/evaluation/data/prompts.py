"""Prompt construction: the QA prompts of Farquhar et al. (2024) and the LLM-as-a-judge prompt.

Short answers::

    Answer the following question as briefly as possible.
    Question: {q1}
    Answer: {a1}

    ...(5 few-shot blocks)...
    Question: {q}
    Answer:

Long answers: the sentence instruction and no few-shot block. SVAMP puts the problem body in a
``Context: {body}`` line before each ``Question:`` line. The prompt is the *user text*; the backend
wraps it in the chat template of instruction-tuned models, as one user turn (gnll's choice: the paper
does not say how it prompted them, and Farquhar et al.'s code feeds every model the raw text).
With ``fewshot_as_multiturn`` (:func:`build_messages`) the same text also carries chat turns: the
instruction and the first few-shot question as the first user turn, each few-shot answer as an
assistant turn, and each later question as a user turn, so a chat model sees worked exchanges
instead of one long message (``docs/evaluation.md`` compares the formats).

Example
-------
>>> from gnll.evaluation.data.datasets import Example
>>> print(build_prompt(BRIEF_LONG, [], Example("1", "Who wrote Hamlet?", ("Shakespeare",))))
Answer the following question in a single brief but complete sentence.
Question: Who wrote Hamlet?
Answer:
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from gnll.backends.prompting import BRIEF_LONG, BRIEF_SHORT, instruction_prompt, question_block
from gnll.evaluation.data.datasets import Example
from gnll.text import answer_tokens

__all__ = [
    "BRIEF_LONG",
    "ask_prompt",
    "canonical_answer",
    "rank_aliases",
    "BRIEF_SHORT",
    "JUDGE_MAX_ANSWERS",
    "build_messages",
    "build_prompt",
    "fewshot_prefix",
    "format_block",
    "judge_prompt",
]

#: At most this many distinct (after SQuAD normalisation) gold answers are listed in a judge prompt
#: (TriviaQA has questions with 200+ aliases; small judges drown in them).
JUDGE_MAX_ANSWERS = 10


def rank_aliases(answers: Sequence[str]) -> list[str]:
    """Gold aliases, most "central" first.

    Aliases are de-duplicated after SQuAD normalisation and ordered by the mean, over their tokens,
    of
    the number of aliases that contain the token (ties: fewer tokens, shorter, original order).
    TriviaQA's alias lists start with an arbitrary redirect title ("The Bill Bailey trilogy" for
    Catherine Cookson), so the first alias is a poor few-shot answer; the most central one is the
    canonical name in practice.

    >>> rank_aliases(["The Bill Bailey trilogy", "Dame Catherine Cookson", "Catherine Cookson",
    ...               "Catherine Marchant", "Katie McMullen", "Catherine Ann McMullen"])[0]
    'Catherine Cookson'
    """
    distinct: list[str] = []
    toks: list[list[str]] = []
    seen: set[str] = set()
    for a in answers:
        t = answer_tokens(a)
        key = " ".join(t)
        if key and key not in seen:
            seen.add(key)
            distinct.append(a)
            toks.append(t)
    if len(distinct) <= 1:
        return distinct or list(answers[:1])
    df = Counter(tok for t in toks for tok in set(t))
    centrality = [sum(df[tok] for tok in t) / len(t) for t in toks]
    order = sorted(
        range(len(distinct)), key=lambda i: (-centrality[i], len(toks[i]), len(distinct[i]), i)
    )
    return [distinct[i] for i in order]


def canonical_answer(answers: Sequence[str]) -> str:
    """The answer shown in a few-shot block: the most central alias (:func:`rank_aliases`)."""
    return rank_aliases(answers)[0]


def format_block(example: Example, answer: str | None = None) -> str:
    """One ``[Context: ..\\n]Question: ..\\nAnswer:`` block; with ``answer``, a few-shot block."""
    text = question_block(example.question, context=example.context)
    if answer is not None:
        return text + f" {answer}\n\n"
    return text


def fewshot_prefix(instruction: str, fewshot: Sequence[Example]) -> str:
    """Instruction line and the few-shot blocks (each answered with its canonical answer)."""
    return (
        instruction
        + "\n"
        + "".join(format_block(ex, canonical_answer(ex.answers)) for ex in fewshot)
    )


def build_prompt(instruction: str, fewshot: Sequence[Example], example: Example) -> str:
    """The full user prompt for ``example``."""
    return fewshot_prefix(instruction, fewshot) + format_block(example)


def ask_prompt(question: str, *, long: bool = False) -> str:
    """The zero-shot prompt of ``gnll ask`` and :func:`gnll.ask`: the instruction, no few-shot block.

    >>> print(ask_prompt("Who wrote Hamlet?"))
    Answer the following question as briefly as possible.
    Question: Who wrote Hamlet?
    Answer:
    """
    return instruction_prompt(question, long=long)


def build_messages(
    instruction: str, fewshot: Sequence[Example], example: Example
) -> list[dict[str, str]]:
    """The prompt of :func:`build_prompt` as chat turns (few-shot answers as assistant turns).

    Every user turn is a ``[Context: ..\n]Question: ..\nAnswer:`` block, the first one preceded by
    the instruction line, so a model answers in the same format it was shown.

    >>> m = build_messages(BRIEF_SHORT, [Example("0", "2+2?", ("4",))], Example("1", "3+3?", ("6",)))
    >>> [t["role"] for t in m], m[1]["content"]
    (['user', 'assistant', 'user'], '4')
    >>> print(m[0]["content"])
    Answer the following question as briefly as possible.
    Question: 2+2?
    Answer:
    """
    turns: list[dict[str, str]] = []
    for ex in fewshot:
        turns.append({"role": "user", "content": format_block(ex)})
        turns.append({"role": "assistant", "content": canonical_answer(ex.answers)})
    turns.append({"role": "user", "content": format_block(example)})
    turns[0]["content"] = instruction + "\n" + turns[0]["content"]
    return turns


def judge_prompt(
    question: str, answers: Sequence[str], prediction: str, *, max_answers: int = JUDGE_MAX_ANSWERS
) -> str:
    """The reference LLM-as-a-judge prompt (Farquhar et al. 2024, ``model_based_metric``).

    Examples
    --------
    >>> print(judge_prompt("Who wrote Hamlet?", ["Shakespeare"], "William Shakespeare"))
    We are assessing the quality of answers to the following question: Who wrote Hamlet?
    The expected answer is: Shakespeare.
    The proposed answer is: William Shakespeare
    Within the context of the question, does the proposed answer mean the same as the expected answer? Respond only with yes or no.
    Response:
    """  # noqa: E501
    golds = rank_aliases(answers)[:max_answers]
    prompt = f"We are assessing the quality of answers to the following question: {question}\n"
    if len(golds) == 1:
        prompt += f"The expected answer is: {golds[0]}.\n"
    else:
        prompt += f"The following are expected answers to this question: {golds}.\n"
    prompt += f"The proposed answer is: {prediction}\n"
    if len(golds) == 1:
        prompt += (
            "Within the context of the question, does the proposed answer mean the same as the "
            "expected answer?"
        )
    else:
        prompt += (
            "Within the context of the question, does the proposed answer mean the same as any "
            "of the expected answers?"
        )
    return prompt + " Respond only with yes or no.\nResponse:"
