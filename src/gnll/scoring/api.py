"""``gnll.score``: teacher-forced NLL of answers that already exist, on any backend that can score.

Example::

    from gnll import load_model, score
    model = load_model("smollm2-135m-instruct")
    [s] = score(model, ["What is the capital of France?"], ["Paris"], prompt_format="instruction")
    s.nll, s.is_greedy      # NLL of "Paris" as `gnll ask` asks; whether greedy decoding gives it
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gnll.backends.base import Model, ScoredAnswer
from gnll.backends.prompting import PromptFormat, prompt_for
from gnll.measures import check_logprobs

__all__ = ["ScoringError", "check_scored", "join_answer", "score"]


class ScoringError(ValueError):
    """A model cannot score, or returned something that is not a valid score."""


def check_scored(item: ScoredAnswer, answer: str) -> ScoredAnswer:
    """Refuse a score that is not a valid log-likelihood (NaN, inf, positive, or no tokens).

    Returns ``item`` with round-off above 0 clamped (:func:`gnll.measures.check_logprobs`).
    """
    lps = item.token_logprobs
    if not item.token_ids or len(lps) != len(item.token_ids):
        raise ScoringError(
            f"the backend returned {len(item.token_ids)} tokens and {len(lps)} log-probs for "
            f"answer {answer[:40]!r}"
        )
    try:
        clean = check_logprobs(lps, where=f"answer {answer[:40]!r}", tokens=item.tokens)
    except ValueError as exc:
        raise ScoringError(str(exc)) from None
    return replace(item, token_logprobs=clean.tolist())


def join_answer(rendered_prompt: str, answer: str) -> str:
    r"""The answer as the model would have written it after ``rendered_prompt``.

    ``gnll ask``/``gnll eval`` report answers stripped of surrounding white space, but after a prompt
    that ends in a non-space character (``"...Answer:"`` without a chat template) the model wrote
    ``" Paris"``: the space goes back in front. After a chat template's ``"assistant\n"`` nothing
    changes, nor does an answer that already starts with white space.

    >>> join_answer("Question: Capital of France?\nAnswer:", "Paris")
    ' Paris'
    >>> join_answer("<|im_start|>assistant\n", "Paris")
    'Paris'
    """
    if rendered_prompt and not rendered_prompt[-1].isspace() and answer and not answer[0].isspace():
        return " " + answer
    return answer


def score(
    model: Model,
    prompts: Sequence[str] | Sequence[Sequence[dict[str, str]]],
    answers: Sequence[str],
    *,
    prompt_format: PromptFormat = "chat",
    long: bool = False,
    raw_prompt: bool = False,
    verbatim: bool = False,
    batch_size: int | None = None,
    progress: bool = False,
    traces: Sequence[str | None] | None = None,
) -> list[ScoredAnswer]:
    """Score each ``answers[i]`` as the continuation of ``prompts[i]`` (teacher forcing, no sampling).

    Parameters
    ----------
    model:
        A loaded model whose ``capabilities.scoring`` is true (the in-process backend; vLLM-style
        servers that echo prompt log-probs).
    prompts:
        What each answer answers, in ``prompt_format``.
    prompt_format:
        How ``prompts`` become what the model conditions on (:mod:`gnll.backends.prompting`):
        ``"instruction"``: questions, asked as ``gnll ask`` and ``gnll score``'s ``question`` field
        ask them (the same question and answer give the same number on every surface);
        ``"chat"`` (default): user text as one user turn, or lists of chat turns, through the
        model's chat template, as :meth:`Model.generate` renders a prompt; ``"text"``: the exact
        string the model conditions on.
    long:
        With ``"instruction"``: the long-answer instruction (``gnll ask --long``).
    raw_prompt:
        The same as ``prompt_format="text"`` (kept for existing callers).
    answers:
        The answers to score; each must be a non-empty string. As ``gnll ask`` prints them (stripped):
        a space is put back in front where the prompt ends without white space
        (:func:`join_answer`), unless ``verbatim=True``.

    traces:
        For a reasoning model (``load_model(..., reasoning="think")``): each answer's trace,
        teacher-forced as context before it (``None`` for a row: the model's own greedy trace).
        The answer alone is scored, conditioned on prompt + trace.

    Returns
    -------
    list of ScoredAnswer
        ``nll``, ``ln_nll``, ``num_tokens``, per-token log-probs, ``is_greedy``, ``greedy_stops`` and
        ``boundary_merged`` of each answer. The NLL of the model's own greedy answer is its G-NLL.
    """
    if raw_prompt:
        prompt_format = "text"
    missing = model.capabilities.missing(["scoring"])
    if missing:
        raise ScoringError(
            f"{model.name} cannot score given answers (its backend cannot "
            "teacher-force: no prompt log-probs); use the in-process backend or a vLLM server"
        )
    if isinstance(prompts, str) or isinstance(answers, str):
        raise TypeError("prompts and answers must be sequences of strings; wrap one item as [item]")
    if len(prompts) != len(answers):
        raise ValueError(f"{len(prompts)} prompts but {len(answers)} answers")
    for i, a in enumerate(answers):
        if not isinstance(a, str) or not a.strip():
            raise ValueError(f"answer {i} is empty or not a string: {a!r}")
    if not answers:
        return []
    rendered = [prompt_for(p, prompt_format, long=long) for p in prompts]
    raw = rendered[0][1]  # one format, so one raw flag for all
    texts = [p for p, _ in rendered]
    reasoning = model.capabilities.reasoning is not None
    if traces is not None:
        if len(traces) != len(answers):
            raise ValueError(f"{len(traces)} traces but {len(answers)} answers")
        if not reasoning and any(t is not None for t in traces):
            raise ScoringError(
                "a 'trace' needs a reasoning model, whose template says where a trace goes: "
                "load it with reasoning=think (or harmony, marker:TEXT; --model_args reasoning=think)"
            )
    joined = list(answers)
    if not verbatim:
        joined = [
            join_answer(
                model.context(p, "", raw_prompt=raw)
                if reasoning
                else (p if raw else model.render_prompt(p)),
                a,
            )
            for p, a in zip(texts, answers, strict=True)
        ]
    kw = {"traces": traces} if reasoning else {}
    out = model.score(texts, joined, raw_prompt=raw, batch_size=batch_size, progress=progress, **kw)
    if len(out) != len(answers):
        raise ScoringError(f"the backend returned {len(out)} scores for {len(answers)} answers")
    return [replace(check_scored(item, a), text=a) for item, a in zip(out, answers, strict=True)]
