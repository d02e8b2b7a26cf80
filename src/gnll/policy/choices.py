"""An OpenAI-shaped choice as the :class:`~gnll.policy.Answer` the policy decides on.

The proxy and the framework integrations (:mod:`gnll.integrations`) read choices with
:func:`choice_answer`, so a response scored by either gets the same numbers.
"""

from __future__ import annotations

from typing import Any, Literal

from gnll.backends.base import GenerationConfig
from gnll.backends.openai.client import ServerError
from gnll.backends.openai.parse import read_choice, to_generation
from gnll.backends.openai.reasoning import reasoning_text
from gnll.backends.reasoning import reasoning_format
from gnll.measures import LogprobError
from gnll.policy.answers import Answer

__all__ = ["choice_answer"]


def choice_answer(
    choice: dict[str, Any],
    config: GenerationConfig,
    *,
    eos_logprob: bool,
    decoding: Literal["greedy", "sampled"] = "greedy",
    where: str = "choice 0",
    reasoning: str | None = None,
    labels: list[Any] | None = None,
) -> Answer:
    """The :class:`Answer` of one OpenAI-shaped choice (any of the three log-prob shapes): its text
    and its answer tokens' log-probs, the terminator split off by the server backend's parser.

    The proxy and the framework integrations (:mod:`gnll.integrations`) read choices with it, so a
    response scored by either gets the same numbers. A choice without usable log-probs is a
    :class:`LogprobError`. A reasoning model's choice (``message.reasoning``, or any choice when
    ``reasoning`` names the format of a server without a reasoning parser) is scored on its
    answer only (:mod:`gnll.backends.reasoning`; ``labels``: a stream's per-token labels); one
    whose log-probs cannot be aligned with its answer is a :class:`LogprobError` too.
    """
    holder = choice["message"] if isinstance(choice.get("message"), dict) else choice
    parsed = reasoning_text(holder) if isinstance(holder, dict) else None  # the server's own split
    try:
        raw = read_choice(choice, reasoning=reasoning, labels=labels)
        if raw.reasoning is not None and not raw.reasoning.marker_reported and labels:
            raise ServerError(
                "the stream carried no token for the end-of-reasoning marker (llama.cpp sends "
                "no chunk for a token that adds no text), so which tokens lie between trace "
                "and answer is unknown and the answer's G-NLL cannot be aligned; ask with "
                '"stream": false'
            )
        gen = to_generation(raw, config, eos_logprob=eos_logprob, where=where)
    except ServerError as exc:
        raise LogprobError(str(exc)) from None
    text = choice.get("text") if "text" in choice else (choice.get("message") or {}).get("content")
    if gen.reasoning is not None and not parsed and text and text != raw.text:
        # No reasoning parser upstream (``reasoning`` named the format): split the text as one
        # would, the trace into ``reasoning`` beside the answer. (A parser's own split stays as
        # it is, its answer's leading white space included.)
        trace = text[: len(text) - len(raw.text.lstrip())]
        span = reasoning_format(reasoning or "think").find(trace)
        holder["reasoning"] = trace[: span[0]] if span else trace
        text = raw.text.lstrip()
    return Answer(
        text=text or "",
        finish_reason=choice.get("finish_reason"),
        tokens=gen.tokens,
        token_logprobs=gen.token_logprobs,
        decoding=decoding,
        measured_logprobs=gen.measured_logprobs,
        reasoning=gen.reasoning,
    )
