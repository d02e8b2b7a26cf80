"""DSPy: the G-NLL of one output field's value, on the ``Prediction`` (``pip install "gnll[dspy]"``).

DSPy's log-probs (``dspy.LM(..., logprobs=True)``) cover the adapter's whole output: the field
markers (``[[ ## answer ## ]]`` of the ``ChatAdapter``) or the JSON keys and punctuation (the
``JSONAdapter``) as well as the values. :class:`FieldConfidence` runs a ``dspy.Predict`` with
log-probs and greedy decoding and scores only the tokens of one output field's value, with
:func:`gnll.spans.span_nlls` (the value's character range in the completion; a token straddling its
edge counts where most of its characters are): ``prediction.g_nll`` is that field's NLL, and
``prediction.uncertainty`` says the rest (``num_tokens``, ``p_correct`` and ``abstain`` from the
policy, the whole completion's ``completion_nll``).

**Tool calls.** :func:`with_tool_uncertainty` puts the same on each step of a ``dspy.ReAct`` agent:
the step's call (its ``next_tool_name`` and ``next_tool_args`` fields) gets the record ``gnll
serve`` gives a tool call (``g_nll`` over the name's and the argument values' tokens, ``name_nll``,
each argument value's NLL, ``least_certain_argument``, ``withheld``;
:func:`gnll.policy.tools.decide_tool_answer`), readable as each step's
``prediction.uncertainty["tool_calls"]`` and in the step module's ``records``. Under ``refuse`` a
withheld call is not run: the step becomes ReAct's ``finish`` (no tool of yours runs), its thought
the refusal that names the withheld call, and the agent answers from what it has.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import dspy

from gnll.backends.openai.parse import logprob_entries
from gnll.integrations.core import AnswerScorer, decoding_of, make_policy
from gnll.policy import AbstentionPolicy
from gnll.policy.tools import decide_tool_answer
from gnll.spans import Segment, json_segments, span_nlls
from gnll.toolcalls import ParsedCall

__all__ = ["FieldConfidence", "ToolStepConfidence", "field_segment", "with_tool_uncertainty"]

_MARKER = re.compile(r"\[\[ ## (\w+) ## \]\]")


def _plain(obj: Any) -> Any:
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    dump = getattr(obj, "model_dump", None)
    if dump is not None:
        return dump()
    try:
        return {k: _plain(v) for k, v in dict(obj).items()}
    except (TypeError, ValueError):
        return {k: _plain(v) for k, v in vars(obj).items() if not k.startswith("_")}


def field_segment(completion: str, field: str) -> Segment:
    """Where ``field``'s value sits in an adapter's completion: after its ``[[ ## field ## ]]``
    marker up to the next marker (white space trimmed), or the JSON value at ``$.field``.

    >>> text = "[[ ## answer ## ]]\\nParis\\n\\n[[ ## completed ## ]]"
    >>> s = field_segment(text, "answer"); text[s.start:s.end]
    'Paris'
    >>> s = field_segment('{"answer": "Paris"}', "answer"); '{"answer": "Paris"}'[s.start:s.end]
    'Paris'
    """
    markers = list(_MARKER.finditer(completion))
    for n, m in enumerate(markers):
        if m.group(1) != field:
            continue
        end = markers[n + 1].start() if n + 1 < len(markers) else len(completion)
        start = m.end()
        while start < end and completion[start].isspace():
            start += 1
        while end > start and completion[end - 1].isspace():
            end -= 1
        return Segment(start, end, field)
    try:
        for seg in json_segments(completion):
            if seg.path == f"$.{field}":
                return seg
    except ValueError:
        pass
    raise ValueError(
        f"the completion has no {field!r} field (neither a `[[ ## {field} ## ]]` marker nor a "
        f"JSON key): {completion[:120]!r}"
    )


class FieldConfidence(dspy.Module):
    """``dspy.Predict(signature)`` whose ``Prediction`` carries the G-NLL of one output field.

    Parameters
    ----------
    signature:
        A DSPy signature (``"question -> answer"``) or class.
    field:
        The output field to score (default: the signature's last output field).
    policy, calibration, threshold, server:
        As :func:`gnll.integrations.langchain.with_uncertainty`; the policy decides on the field's
        NLL (``refuse`` replaces the field's value by the refusal).

    Examples
    --------
    With ``dspy.configure(lm=dspy.LM("openai/MODEL", api_base=URL, api_key="x"))``::

        qa = FieldConfidence("question -> answer")
        p = qa(question="What is the capital of France?")
        p.answer, p.g_nll, p.uncertainty["p_correct"]
    """

    def __init__(
        self,
        signature: Any,
        field: str | None = None,
        *,
        policy: AbstentionPolicy | str = "annotate",
        calibration: str | Path | None = None,
        threshold: float | None = None,
        server: str = "generic",
        top_logprobs: int = 1,
    ) -> None:
        super().__init__()
        self.predict = dspy.Predict(signature)
        outputs = list(self.predict.signature.output_fields)
        self.field = field or outputs[-1]
        if self.field not in outputs:
            raise ValueError(f"{self.field!r} is not an output field of {outputs}")
        self.scorer = AnswerScorer(
            policy=make_policy(policy, calibration=calibration, threshold=threshold),
            server=server,
            prompt_format=None,  # the adapter's prompt is no gnll format
        )
        self.lm_kwargs = self.scorer.policy.pin({}, top_logprobs=top_logprobs)

    def forward(self, **kwargs: Any) -> dspy.Prediction:
        # a call's own config may change the decoding; the policy pins what it decides on
        config = self.scorer.policy.pin({**self.lm_kwargs, **kwargs.pop("config", {})})
        pred = self.predict(config=config, **kwargs)
        logprobs = _plain(getattr(pred, "logprobs", None) or pred.get("logprobs"))
        if not logprobs:
            raise ValueError(
                "the LM returned no log-probs: use a dspy.LM on a server that returns them "
                "(`gnll doctor URL`)"
            )
        entries = logprob_entries(logprobs) if isinstance(logprobs, dict) else logprobs
        completion = "".join(str(e.get("token", "")) for e in entries)
        whole = self.scorer.score(
            completion,
            {"content": entries},
            decoding=decoding_of(config.get("temperature")),
            where="the DSPy completion",
        )
        # the answer tokens (terminator split off as gnll serve does) and their log-probs
        tokens = [str(e.get("token", "")) for e in entries][: whole.uncertainty.num_tokens]
        lps = [float(e["logprob"]) for e in entries][: whole.uncertainty.num_tokens]
        seg = field_segment(completion, self.field)
        span = span_nlls(tokens, lps, completion, [seg]).spans[0]
        greedy = whole.uncertainty.decoding == "greedy"  # a sampled answer has no G-NLL to decide
        p_correct, abstain = self.scorer.policy.decide(span.nll, None) if greedy else (None, None)
        pred.g_nll = span.nll
        pred.uncertainty = {
            "field": self.field,
            "g_nll": span.nll,
            "num_tokens": span.num_tokens,
            "straddling": span.straddling,
            "p_correct": p_correct,
            "abstain": abstain,
            "completion_nll": whole.uncertainty.g_nll,
            "completion_tokens": whole.uncertainty.num_tokens,
        }
        if abstain and self.scorer.policy.mode == "refuse":
            # nothing of the refused answer stays: the field, its log-probs, the completions
            pred[self.field] = self.scorer.policy.refusal
            if pred.get("logprobs") is not None:
                pred["logprobs"] = None
            pred._completions = None
            pred.uncertainty["refused"] = True
        return pred


def _entries(pred: Any) -> list[dict[str, Any]]:
    logprobs = _plain(getattr(pred, "logprobs", None) or pred.get("logprobs"))
    if not logprobs:
        raise ValueError(
            "the LM returned no log-probs: use a dspy.LM on a server that returns them "
            "(`gnll doctor URL`)"
        )
    return list(logprob_entries(logprobs) if isinstance(logprobs, dict) else logprobs)


def _step_call(completion: str, name: str) -> ParsedCall:
    """A ReAct step's call as the parts of its completion: the ``next_tool_name`` field's value,
    and the leaves of the ``next_tool_args`` field's JSON object (its arguments)."""
    name_seg = field_segment(completion, "next_tool_name")
    args_seg = field_segment(completion, "next_tool_args")
    args_text = completion[args_seg.start : args_seg.end]
    try:
        arguments = json.loads(args_text)
        leaves = json_segments(args_text)
    except ValueError:
        raise ValueError(
            f"the ReAct step's next_tool_args is not one JSON object: {args_text[:120]!r}"
        ) from None
    return ParsedCall(
        name=name,
        arguments=arguments if isinstance(arguments, dict) else {},
        arguments_text=args_text,
        start=name_seg.start,
        end=args_seg.end,
        name_segment=Segment(name_seg.start, name_seg.end, "name"),
        argument_segments=tuple(
            Segment(args_seg.start + x.start, args_seg.start + x.end, x.path[2:]) for x in leaves
        ),
    )


class ToolStepConfidence(dspy.Module):
    """A ReAct step (its ``dspy.Predict``) whose call is scored and gated (see the module).

    ``records`` keeps every step's record (``tool_calls``: the call's numbers).
    """

    def __init__(self, predict: Any, scorer: AnswerScorer, *, top_logprobs: int = 1) -> None:
        super().__init__()
        self.predict = predict
        self.scorer = scorer
        self.lm_kwargs = scorer.policy.pin({}, top_logprobs=top_logprobs)
        self.records: list[dict[str, Any]] = []

    def forward(self, **kwargs: Any) -> dspy.Prediction:
        config = self.scorer.policy.pin({**self.lm_kwargs, **kwargs.pop("config", {})})
        pred = self.predict(config=config, **kwargs)
        entries = _entries(pred)
        completion = "".join(str(e.get("token", "")) for e in entries)
        answer = self.scorer.answer(
            completion,
            {"content": entries},
            decoding=decoding_of(config.get("temperature")),
            where="the DSPy ReAct step",
        )
        name = str(pred.next_tool_name)
        # ReAct's own end of the loop is no tool: nothing to gate
        calls = [] if name == "finish" else [_step_call(answer.text, name)]
        policy = self.scorer.policy if calls else replace(self.scorer.policy, mode="annotate")
        out = decide_tool_answer(
            answer,
            calls,
            policy,
            argument_threshold=self.scorer.tool_argument_threshold,
            prompt_format=None,  # the adapter's prompt is no gnll format
            source="the DSPy ReAct step",
        )
        pred.uncertainty = out.record.to_json()
        self.records.append(pred.uncertainty)
        if out.withheld:  # nothing of the withheld call stays, and no tool runs
            pred.next_thought = out.text
            pred.next_tool_name = "finish"
            pred.next_tool_args = {}
            if pred.get("logprobs") is not None:
                pred["logprobs"] = None
            pred._completions = None
        return pred


def with_tool_uncertainty(
    react: Any,
    *,
    policy: AbstentionPolicy | str = "annotate",
    calibration: str | Path | None = None,
    threshold: float | None = None,
    tool_argument_threshold: float | None = None,
    server: str = "generic",
    top_logprobs: int = 1,
) -> Any:
    """``react`` (a ``dspy.ReAct``) with each step's call scored and, under ``refuse``, gated (see
    the module); its steps' records are in ``react.react.records``.

    Examples
    --------
    With ``dspy.configure(lm=dspy.LM("openai/MODEL", api_base=URL, api_key="x"))``::

        agent = with_tool_uncertainty(dspy.ReAct("question -> answer", tools=[get_weather]),
                                      policy="refuse", threshold=3.0)
        agent(question="Weather in Paris?")
        agent.react.records[0]["tool_calls"][0]["least_certain_argument"]
    """
    scorer = AnswerScorer(
        policy=make_policy(policy, calibration=calibration, threshold=threshold),
        server=server,
        prompt_format=None,
        tool_argument_threshold=tool_argument_threshold,
    )
    react.react = ToolStepConfidence(react.react, scorer, top_logprobs=top_logprobs)
    return react
