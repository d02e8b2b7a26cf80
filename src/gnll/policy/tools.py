"""The policy on tool calls: each call's record and decision, and what a client is sent.

One home for what ``gnll serve`` (in-process; :mod:`gnll.serving.tools`) and the framework
integrations (:mod:`gnll.integrations`) do with an answer that holds calls: the per-call report
(:func:`gnll.toolcalls.call_report`), the gate (:func:`gate_calls`: the policy decides each call as
it decides an answer, plus the argument threshold), and the record a withheld call leaves (its
numbers, not its text or tokens). :func:`decide_tool_answer` is the whole of it for one answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from gnll.policy.abstention import AbstentionPolicy
from gnll.policy.answers import Answer, annotate
from gnll.toolcalls import UNCLOSED, ParsedCall, call_report
from gnll.toolwatch import CallWatch
from gnll.uncertainty import Uncertainty

__all__ = ["ToolAnswer", "decide_tool_answer", "gate_calls", "withheld_text", "without_text"]


def gate_calls(
    policy: AbstentionPolicy,
    calls: list[dict[str, Any]],
    *,
    argument_threshold: float | None,
    prompt_format: str | None,
) -> list[dict[str, Any]]:
    """Each call's report with the policy's decision on it: ``p_correct`` and ``abstain`` from the
    call's G-NLL, ``arguments_over_threshold`` when an argument value's NLL is above
    ``argument_threshold``, and ``withheld`` when the policy keeps the call from the client
    (``refuse``; ``escalate``, when no larger model answers the call instead).

    The one place a call is decided: the policy object decides the call as it decides an answer.
    """
    out = []
    for call in calls:
        p, abstain = policy.decide(call["g_nll"], prompt_format)
        over = None
        if argument_threshold is not None:
            over = [a["path"] for a in call["arguments"] if a["nll"] > argument_threshold]
        decided = {
            **call,
            "p_correct": p,
            "abstain": abstain,
            "arguments_over_threshold": over,
        }
        blocked = bool(abstain) or bool(over)
        decided["withheld"] = blocked and policy.mode in ("refuse", "escalate")
        out.append(decided)
    return out


def withheld_text(calls: Sequence[dict[str, Any]], refusal: str) -> str:
    """The assistant message a client gets instead of withheld calls (it names them)."""
    names = ", ".join(
        f"{c['name'] or 'a function not yet named'} (call {c['index']})"
        for c in calls
        if c["withheld"]
    )
    return f"{refusal} The tool call was withheld: {names}."


def without_text(call: dict[str, Any]) -> dict[str, Any]:
    """A withheld call's record: its numbers, not what it would have sent."""
    args = [{k: v for k, v in a.items() if k != "text"} for a in call["arguments"]]
    return {**call, "arguments": args}


@dataclass(frozen=True)
class ToolAnswer:
    """An answer that may hold calls, decided: its record, the text a client reads, the calls'
    decided reports (empty: a plain answer) and whether they are withheld."""

    record: Uncertainty
    text: str
    finish_reason: str | None
    calls: list[dict[str, Any]]
    withheld: bool


def decide_tool_answer(
    answer: Answer,
    calls: Sequence[ParsedCall],
    policy: AbstentionPolicy,
    *,
    content: str = "",
    error: str | None = None,
    argument_threshold: float | None = None,
    prompt_format: str | None = None,
    include_tokens: bool = False,
    source: str = "model",
    constrained_logprobs: Sequence[float] | None = None,
    watch: CallWatch | None = None,
) -> ToolAnswer:
    """The record and client text of ``answer`` (its ``text`` the whole output, tags included),
    whose ``calls`` were parsed from it (:func:`gnll.toolcalls.parse_output`; ``content``: the
    text outside them, ``error``: why a block was dropped).

    Without calls the policy decides the answer as any other. With calls it decides each call
    (:func:`gate_calls`), not the output as a whole: when one is withheld the client reads
    :func:`withheld_text`, and the record keeps each call's numbers but none of the output's
    text, tokens, log-probs or spans; otherwise the client reads ``content`` and the calls.

    ``watch``: a :class:`gnll.toolwatch.CallWatch` that read the answer's tokens as they were
    decoded (exact early decisions). A call it decided on is withheld, complete or not: a call
    the decoding stopped at (``answer.early``), or broke off, is recorded from the watch (its
    NLLs so far, ``early: true`` when decoding stopped there).
    """
    # An output with calls is decided per call, not refused as a whole.
    whole = replace(policy, mode="annotate") if calls else policy
    [record], [text], [finish] = annotate(
        [answer],
        whole,
        include_tokens=include_tokens,
        source=source,
        prompt_format=prompt_format,
    )
    report = call_report(
        answer.tokens,
        answer.token_logprobs,
        answer.text,
        calls,
        constrained_logprobs=constrained_logprobs,
    )
    decided = gate_calls(
        policy, report, argument_threshold=argument_threshold, prompt_format=prompt_format
    )
    if watch is not None and watch.decided_call is not None:
        n = watch.decided_call
        if n < len(decided):
            decided[n]["withheld"] = True
        else:  # a call stopped at its decision (or broken off): the watch's record of it
            part = watch.report()[n]
            p, _ = policy.decide(part["g_nll"], prompt_format)
            decided.append({**part, "p_correct": p, "withheld": True})
        if answer.early is not None:
            decided[n]["early"] = True  # decided before the call was complete: its NLLs so far
            if error is not None and error.startswith(UNCLOSED):
                error = None  # the block decoding stopped in, not one the model left open
    withheld = any(c["withheld"] for c in decided)
    update: dict[str, Any] = {"tool_calls": decided or None, "tool_call_error": error}
    if any(c["abstain"] is not None or c["arguments_over_threshold"] is not None for c in decided):
        # An output with calls abstains when one of its calls does (what a cascade escalates).
        update["abstain"] = any(
            bool(c["abstain"] or c["arguments_over_threshold"]) for c in decided
        )
    if withheld:
        update.update(
            tool_calls=[without_text(c) for c in decided],
            refused=True,
            tokens=None,
            token_logprobs=None,
            top_logprobs=None,
            spans=None,
            least_certain_span=None,
        )
        text, finish = withheld_text(decided, policy.refusal), "stop"
    elif calls:
        text = content
        finish = "tool_calls" if answer.finish_reason != "length" else "length"
    return ToolAnswer(record.model_copy(update=update), text, finish, decided, withheld)
