"""An OpenAI-shaped choice as the :class:`~gnll.policy.Answer` the policy decides on.

The proxy and the framework integrations (:mod:`gnll.integrations`) read choices with
:func:`choice_answer`, so a response scored by either gets the same numbers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from gnll.backends.base import GenerationConfig
from gnll.backends.openai.client import ServerError
from gnll.backends.openai.parse import logprob_entries, logprob_shape, read_choice, to_generation
from gnll.backends.openai.reasoning import reasoning_text
from gnll.backends.reasoning import reasoning_format
from gnll.measures import LogprobError
from gnll.policy.answers import Answer

if TYPE_CHECKING:
    from gnll.toolcalls import ParsedCall

__all__ = ["choice_answer", "tool_choice_answer"]


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


def tool_choice_answer(
    choice: dict[str, Any],
    config: GenerationConfig,
    *,
    eos_logprob: bool,
    decoding: Literal["greedy", "sampled"] = "greedy",
    where: str = "choice 0",
) -> tuple[Answer, tuple[ParsedCall, ...]]:
    """The :class:`Answer` of a chat choice whose message carries ``tool_calls`` (a server's tool
    parser took them out of the text), over the **whole output** the model wrote: the content,
    the call markers and the calls, the tokens its ``logprobs.content`` spells (vLLM reports the
    tool-call tokens there, not in ``message.content``). With it, each call located in that text
    (:func:`gnll.toolcalls.locate_calls`), so that :func:`gnll.toolcalls.call_report` can score it.

    The terminator is split off as for any answer: a server that reports its end-of-sequence
    token (vLLM) has it as the last token; a stop string cuts the text where it starts.

    Raises
    ------
    LogprobError
        No usable log-probs, or a call that is not in the output they spell (naming it).
    """
    from gnll.backends.reasoning import token_pieces
    from gnll.toolcalls import locate_calls

    message: dict[str, Any] = choice["message"] if isinstance(choice.get("message"), dict) else {}
    lp = choice.get("logprobs")
    entries = logprob_entries(lp) if logprob_shape(lp) == "content" else None
    if entries is None:
        raise LogprobError(
            f"{where}: the response carries tool calls but no `logprobs.content`: the server "
            "must report the tool-call tokens' log-probs (run `gnll doctor` against it)"
        )
    tokens = [str(e.get("token", "")) for e in entries]
    byte_lists = [e.get("bytes") for e in entries]
    pieces = token_pieces(
        tokens, byte_lists if byte_lists and all(isinstance(b, list) for b in byte_lists) else None
    )
    stop = choice.get("stop_reason")
    if choice.get("finish_reason") == "length":
        kept = pieces
    elif eos_logprob and not isinstance(stop, str) and pieces:
        kept = pieces[:-1]  # the end-of-sequence (or stop) token the server reports last
    else:
        kept = pieces
    text = b"".join(kept).decode("utf-8", errors="replace")
    if isinstance(stop, str) and stop and stop in text:
        text = text[: text.index(stop)]
    whole = {k: v for k, v in choice.items() if k != "message"}
    whole["message"] = {"role": "assistant", "content": text}
    answer = choice_answer(whole, config, eos_logprob=eos_logprob, decoding=decoding, where=where)
    calls = [
        (str(c["function"]["name"]), c["function"].get("arguments") or "{}")
        for c in message.get("tool_calls") or []
        if isinstance(c, dict) and isinstance(c.get("function"), dict)
    ]
    try:
        located = locate_calls(answer.text, calls)
    except ValueError as exc:
        raise LogprobError(f"{where}: {exc}") from None
    return answer, located
