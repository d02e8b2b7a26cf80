"""Tool calls and structured outputs of the in-process model, and the gate before a tool runs.

A chat request with ``tools`` (and ``tool_choice`` other than ``"none"``):

- the tools are described to the model by the documented tool prompt
  (:func:`gnll.toolcalls.tool_system_prompt`; docs/tools.md), the conversation's earlier calls and
  tool results in the same format;
- ``tool_choice: "auto"``: the model answers freely through the batching engine; an output that
  holds ``<tool_call>`` blocks is parsed strictly (:func:`gnll.toolcalls.parse_output`);
- ``"required"`` or a named function: the call is decoded greedily under a grammar (llguidance) that
  allows only calls of the allowed functions with arguments valid under their schemas;
- each call's uncertainty (its G-NLL, its name's NLL, each argument value's NLL, the tokens each
  scored: :func:`gnll.toolcalls.call_report`) is in ``uncertainty.tool_calls``.

**The gate** (:func:`gate_calls`). Under ``--policy refuse`` and ``escalate`` the policy decides on
each call: on the call's G-NLL, and on each argument value's NLL against
``--tool-argument-threshold``. A withheld call never reaches the client: the response has no
``tool_calls`` (a stream holds every delta until the decision, as a finished answer is replayed),
and the assistant message says which call was withheld, with the call's uncertainty record
(without its text or tokens). The record abstains when a call does, so the escalation cascade
(:mod:`gnll.serving.cascade`) asks the larger model for the call; the reply's ``replay`` replays
either model's call.

A request with ``response_format`` ``json_object`` or ``json_schema`` is decoded under the JSON
(schema) grammar; its record's ``structured`` has both the raw and the constrained NLLs.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import anyio

from gnll.backends.base import ChatPrompt
from gnll.backends.constrained import ConstrainedGeneration, ConstrainedModel
from gnll.policy import AbstentionPolicy, Answer, annotate
from gnll.serving.errors import RequestError
from gnll.serving.protocol.chat import ChatShape
from gnll.serving.protocol.common import Usage, new_id
from gnll.serving.protocol.tools import (
    ResponseFormat,
    ToolRequest,
    call_id,
    tool_call_deltas,
    tool_call_message,
)
from gnll.serving.responses import Reply, sse
from gnll.toolcalls import (
    call_grammar,
    call_report,
    json_grammar,
    parse_output,
    tool_conversation,
)
from gnll.uncertainty import Uncertainty

if TYPE_CHECKING:
    from gnll.serving.inprocess import InProcessService
    from gnll.serving.schemas import ChatCompletionRequest
    from gnll.serving.settings import ServeSettings

__all__ = [
    "calls_abstain",
    "gate_calls",
    "handle_structured",
    "handle_tools",
    "render_messages",
    "replay_body",
    "withhold",
]

#: One constrained decode at a time per process: it runs beside the engine's thread on the same
#: weights, and two of them would only share the cores.
_CONSTRAINED = threading.Lock()


def render_messages(req: ChatCompletionRequest, tools: ToolRequest | None) -> list[dict[str, str]]:
    """The conversation as plain ``{role, content}`` turns for the model's template
    (:func:`gnll.toolcalls.tool_conversation`: the tool prompt joins the system message, earlier
    calls in the documented format, tool results as user turns in ``<tool_response>`` tags)."""
    messages = [
        {"role": m.role, "content": m.text(), "tool_calls": (m.model_extra or {}).get("tool_calls")}
        for m in req.messages
    ]
    return tool_conversation(messages, tools.tool_dicts() if tools is not None else None)


def gate_calls(
    policy: AbstentionPolicy,
    calls: list[dict[str, Any]],
    *,
    argument_threshold: float | None,
    prompt_format: str | None,
) -> list[dict[str, Any]]:
    """Each call's report with the policy's decision on it: ``p_correct`` and ``abstain`` from the
    call's G-NLL, ``argument_abstain`` when an argument value's NLL is above
    ``argument_threshold``, and ``withheld`` when the policy keeps the call from the client
    (``refuse``; ``escalate``, which has no larger model to ask in-process).

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


def calls_abstain(decided: list[dict[str, Any]]) -> bool | None:
    """Whether an output abstains because of its calls (one of them is blocked: what a cascade
    escalates); ``None`` when nothing decided on them."""
    if not any(
        c["abstain"] is not None or c["arguments_over_threshold"] is not None for c in decided
    ):
        return None
    return any(bool(c["abstain"] or c["arguments_over_threshold"]) for c in decided)


def withhold(
    record: Uncertainty, decided: list[dict[str, Any]], refusal: str, error: str | None = None
) -> tuple[dict[str, Any], Uncertainty]:
    """The assistant message and the record of an answer whose calls the gate withheld: the
    message says which function's call was withheld; the record keeps each call's numbers, not
    what it would have sent (no argument texts, tokens, log-probs or spans). In-process and
    through the proxy alike."""
    message = {"role": "assistant", "content": _withheld_text(decided, refusal), "refusal": None}
    return message, record.model_copy(
        update={
            "tool_calls": [_without_text(c) for c in decided],
            "tool_call_error": error,
            "refused": True,
            "tokens": None,
            "token_logprobs": None,
            "top_logprobs": None,
            "spans": None,
            "least_certain_span": None,
        }
    )


def _withheld_text(calls: list[dict[str, Any]], refusal: str) -> str:
    names = ", ".join(f"{c['name']} (call {c['index']})" for c in calls if c["withheld"])
    return f"{refusal} The tool call was withheld: {names}."


def _without_text(call: dict[str, Any]) -> dict[str, Any]:
    """A withheld call's record: its numbers, not what it would have sent."""
    args = [{k: v for k, v in a.items() if k != "text"} for a in call["arguments"]]
    return {**call, "arguments": args}


async def _constrained(
    service: InProcessService, prompt: str, grammar: str, max_tokens: int, param: str
) -> ConstrainedGeneration:
    model = service.model
    if not isinstance(model, ConstrainedModel):
        raise RequestError(
            "this model cannot decode under a grammar (needed for tool_choice required or a named "
            "function, and for response_format JSON)",
            param,
        )
    lm = cast(ConstrainedModel, model)

    def run() -> ConstrainedGeneration:
        with _CONSTRAINED:
            return lm.generate_constrained(prompt, grammar, max_new_tokens=max_tokens)

    try:
        return await anyio.to_thread.run_sync(run)
    except ImportError as exc:
        raise RequestError(
            f"constrained decoding needs llguidance (pip install 'gnll[structured]'): {exc}",
            param,
        ) from None


def _answer(gen: ConstrainedGeneration) -> Answer:
    return Answer(
        text=gen.text,
        finish_reason=gen.finish_reason,
        tokens=list(gen.tokens),
        token_logprobs=list(gen.token_logprobs),
        completion_tokens=len(gen.token_ids) + len(gen.terminator_token_ids),
    )


def _check(req: ChatCompletionRequest, what: str) -> None:
    if not req.greedy or req.n != 1:
        raise RequestError(f"{what} is decoded greedily: send temperature 0 and n 1", "temperature")
    if req.num_top_logprobs:
        raise RequestError(f"top_logprobs is not reported for {what}", "top_logprobs")
    req.check_unwarped()


async def handle_tools(
    service: InProcessService,
    req: ChatCompletionRequest,
    settings: ServeSettings,
    tools: ToolRequest,
) -> Reply:
    """Answer a chat request that offers tools (see the module docstring)."""
    from gnll.serving.inprocess import to_answer

    service.check_model(req.model)
    _check(req, "a request with tools")
    config = req.generation_config(
        default_max_tokens=settings.default_max_tokens, max_tokens_limit=settings.max_tokens_limit
    )
    prompt = ChatPrompt.of(render_messages(req, tools))
    constrained: list[float] | None = None
    if tools.required:
        grammar = call_grammar(
            tools.allowed_functions(),
            parallel=tools.parallel_tool_calls and tools.tool_choice == "required",
        )
        gen = await _constrained(service, prompt, grammar, config.max_new_tokens, "tool_choice")
        answer, constrained = _answer(gen), gen.constrained_logprobs
    else:
        decoded = await service.engine.decode([prompt], config, raw=False)
        answer = to_answer(decoded.generations[0][0], "greedy")
    fmt = "chat"  # the messages (tool prompt included) through the model's chat template
    parsed = parse_output(answer.text, tools.names)
    calls = parsed.calls
    # An output with calls is decided per call (gate_calls), not refused as a whole.
    policy = replace(settings.policy, mode="annotate") if calls else settings.policy
    [record], [text], [finish] = annotate(
        [answer], policy, include_tokens=req.wants_logprobs, prompt_format=fmt
    )
    if not tools.parallel_tool_calls:
        calls = calls[:1]
    report = call_report(
        answer.tokens, answer.token_logprobs, answer.text, calls, constrained_logprobs=constrained
    )
    decided = gate_calls(
        settings.policy,
        report,
        argument_threshold=settings.tool_argument_threshold,
        prompt_format=fmt,
    )
    withheld = any(c["withheld"] for c in decided)
    update: dict[str, Any] = {"tool_calls": decided or None, "tool_call_error": parsed.error}
    if calls_abstain(decided) is not None:
        update["abstain"] = calls_abstain(decided)
    if calls and not withheld:
        ids = [call_id() for _ in calls]
        for c, i in zip(decided, ids, strict=True):
            c["id"] = i
        message = tool_call_message(
            [(i, c.name, c.arguments_text) for i, c in zip(ids, calls, strict=True)],
            parsed.content or None,
        )
        finish = "tool_calls" if answer.finish_reason != "length" else "length"
        record = record.model_copy(update=update)
    elif withheld:
        message, record = withhold(record, decided, settings.policy.refusal, parsed.error)
        finish = "stop"
    else:
        message = {"role": "assistant", "content": text, "refusal": None}
        record = record.model_copy(update=update)
    return _reply(service, req, answer, message, finish, record, prompt)


async def handle_structured(
    service: InProcessService,
    req: ChatCompletionRequest,
    settings: ServeSettings,
    fmt: ResponseFormat,
) -> Reply:
    """Answer a chat request with ``response_format`` JSON: decoded under the (schema) grammar."""
    service.check_model(req.model)
    _check(req, "response_format JSON")
    config = req.generation_config(
        default_max_tokens=settings.default_max_tokens, max_tokens_limit=settings.max_tokens_limit
    )
    prompt = ChatPrompt.of(render_messages(req, None))
    gen = await _constrained(
        service,
        prompt,
        json_grammar(fmt.json_schema_of()),
        config.max_new_tokens,
        "response_format",
    )
    answer = _answer(gen)
    pf = "chat"
    [record], [text], [finish] = annotate(
        [answer], settings.policy, include_tokens=req.wants_logprobs, prompt_format=pf
    )
    structured: dict[str, Any] = {
        "type": fmt.type,
        "logprobs": "raw",
        "constrained_g_nll": 0.0 - sum(gen.constrained_logprobs),
    }
    if record.spans is not None and record.spans_kind == "json" and not record.refused:
        from gnll.spans import Segment, span_nlls

        segs = [Segment(s.start, s.end, s.path) for s in record.spans]
        con = span_nlls(answer.tokens, gen.constrained_logprobs, answer.text, segs)
        structured["fields"] = [
            {"path": s.path, "nll": s.nll, "constrained_nll": c.nll}
            for s, c in zip(record.spans, con.spans, strict=True)
        ]
    record = record.model_copy(update={"structured": structured})
    message = {"role": "assistant", "content": text, "refusal": None}
    return _reply(service, req, answer, message, finish, record, prompt)


def _reply(
    service: InProcessService,
    req: ChatCompletionRequest,
    answer: Answer,
    message: dict[str, Any],
    finish: str | None,
    record: Uncertainty,
    prompt: str,
) -> Reply:
    n_prompt = service.prompt_tokens(prompt, False)
    lp = (
        ChatShape.logprobs(answer, 0).model_dump()
        if req.wants_logprobs and not record.refused
        else None
    )
    body = {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": service.model_name,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": lp,
                "finish_reason": finish,
                "uncertainty": record.to_json(),
            }
        ],
        "usage": Usage.of(n_prompt, [answer]).model_dump(),
    }
    stream = replay_body(body, req.include_usage) if req.stream else None
    # What a cascade keeps of the local reply: the text the client is sent (a withheld call's
    # message, never the call), and the replay that carries the tool-call deltas.
    sent = Answer(message.get("content") or "", finish, [], [], completion_tokens=0)
    return Reply(
        body=body,
        records=[record],
        stream=stream,
        prompt=prompt,
        answers=[sent],
        replay=replay_body,
    )


def replay_body(body: dict[str, Any], include_usage: bool) -> Any:
    """The finished response as stream chunks: nothing goes out before the decision (the whole
    answer is known first), then the text, the tool-call deltas and the uncertainty."""
    base = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    choice = body["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], **more: Any) -> str:
        c = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **more}
        return sse({**base, "choices": [c]})

    def events() -> Any:
        # The output's log-probs (calls included; none for a withheld call) ride on the first
        # chunk: the whole answer is known before any piece goes out.
        yield chunk({"role": "assistant", "content": ""}, logprobs=choice.get("logprobs"))
        if message.get("content"):
            yield chunk({"content": message["content"]})
        for delta in tool_call_deltas(message):
            yield chunk(delta)
        yield chunk({}, finish_reason=choice["finish_reason"], uncertainty=choice["uncertainty"])
        if include_usage:
            yield sse({**base, "choices": [], "usage": body["usage"]})
        yield sse("[DONE]")

    return events()
