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

**The gate** (:func:`gnll.policy.tools.gate_calls`). Under ``--policy refuse`` and ``escalate``
the policy decides on each call: on the call's G-NLL, and on each argument value's NLL against
``--tool-argument-threshold``. A withheld call never reaches the client: the response has no
``tool_calls`` (a stream holds every delta until the decision, as a finished answer is replayed),
and the assistant message says which call was withheld, with the call's uncertainty record
(without its text or tokens). The record abstains when a call does, so the escalation cascade
(:mod:`gnll.serving.cascade`) asks the larger model for the call; the reply's ``replay`` replays
either model's call. With early decisions on, decoding stops at the token where a call's (or an
argument's) running NLL crosses its threshold (:mod:`gnll.toolwatch`; :func:`call_rule` makes
the decoding loops' rule), and every finished output is read by the same watch, so stopping
there and decoding to the end decide alike.

A request with ``response_format`` ``json_object`` or ``json_schema`` is decoded under the JSON
(schema) grammar; its record's ``structured`` has both the raw and the constrained NLLs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import anyio

from gnll.backends.base import ChatPrompt
from gnll.backends.constrained import ConstrainedGeneration, ConstrainedModel
from gnll.backends.early import EarlyDecided
from gnll.measures.early import EarlyDecisionError
from gnll.policy import Answer, annotate
from gnll.policy.tools import decide_tool_answer, gate_calls
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
    json_grammar,
    parse_output,
    tool_conversation,
)
from gnll.toolwatch import ToolCallDecision
from gnll.uncertainty import Uncertainty

if TYPE_CHECKING:
    from gnll.serving.inprocess import InProcessService
    from gnll.serving.schemas import ChatCompletionRequest
    from gnll.serving.settings import ServeSettings

__all__ = ["gate_calls", "handle_structured", "handle_tools", "render_messages", "replay_body"]

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


def call_rule(
    settings: ServeSettings, tools: ToolRequest, prompt_format: str
) -> Callable[[], ToolCallDecision] | None:
    """A maker of exact early decisions on the calls of an output (:mod:`gnll.toolwatch`), or
    ``None`` when the policy withholds no call, or its rule cannot decide before the end (a
    calibrated map that is not monotone)."""
    policy = settings.policy
    if policy.mode not in ("refuse", "escalate") or not policy.active:
        return None
    try:
        policy.check_monotone()
    except EarlyDecisionError:
        return None

    def abstains(g: float) -> bool:
        return bool(policy.decide(g, prompt_format)[1])  # what gate_calls asks of the policy

    return lambda: ToolCallDecision(
        abstains,
        action=policy.mode,
        argument_threshold=settings.tool_argument_threshold,
        max_calls=None if tools.parallel_tool_calls else 1,
    )


def _facts(rule: ToolCallDecision, max_tokens: int) -> EarlyDecided:
    """Where the grammar loop stopped an output, as the decoding loop says it
    (:meth:`gnll.backends.decoding.EarlyStop.decided`)."""
    d = rule.decision
    return EarlyDecided(
        decided_at_token=d.at_token or 0,
        tokens_generated=rule.generated,
        tokens_saved=max_tokens - rule.generated,
        action=d.action,
    )


async def _constrained(
    service: InProcessService,
    prompt: str,
    grammar: str,
    max_tokens: int,
    param: str,
    watch: Callable[[str, float], bool] | None = None,
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
            if watch is None:
                return lm.generate_constrained(prompt, grammar, max_new_tokens=max_tokens)
            return lm.generate_constrained(prompt, grammar, max_new_tokens=max_tokens, watch=watch)

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
    # top_logprobs is accepted (the framework integrations ask for >= 1): the alternatives are
    # reported where the engine's decoding loop records them, as for any chat answer.
    if not req.greedy or req.n != 1:
        raise RequestError(f"{what} is decoded greedily: send temperature 0 and n 1", "temperature")
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
    fmt = "chat"  # the messages (tool prompt included) through the model's chat template
    rule = call_rule(settings, tools, fmt)
    early = rule if rule is not None and settings.decides_early else None
    constrained: list[float] | None = None
    if tools.required:
        grammar = call_grammar(
            tools.allowed_functions(),
            parallel=tools.parallel_tool_calls and tools.tool_choice == "required",
        )
        live = early() if early is not None else None
        gen = await _constrained(
            service,
            prompt,
            grammar,
            config.max_new_tokens,
            "tool_choice",
            watch=live.push_token if live is not None else None,
        )
        answer, constrained = _answer(gen), gen.constrained_logprobs
        if gen.finish_reason == "decided" and live is not None:
            answer.early = _facts(live, config.max_new_tokens)
    else:
        top = req.num_top_logprobs if service.engine.reports_alternatives else 0
        decoded = await service.engine.decode(
            [prompt], config, raw=False, top_logprobs=top, early=early
        )
        tops = decoded.top_logprobs[0] if decoded.top_logprobs else None
        alternatives = tops[0] if tops else None
        # a stopped output says where (Generation.early)
        answer = to_answer(decoded.generations[0][0], "greedy", alternatives)
    # The decision on the tokens as they were decoded: the same whether decoding stopped at it or
    # ran to the end (a call attempt it withholds is withheld even if the model broke it off).
    watch = rule().watch.read(answer.tokens, answer.token_logprobs) if rule is not None else None
    parsed = parse_output(answer.text, tools.names)
    calls = parsed.calls if tools.parallel_tool_calls else parsed.calls[:1]
    decided = decide_tool_answer(
        answer,
        calls,
        settings.policy,
        content=parsed.content,
        error=parsed.error,
        argument_threshold=settings.tool_argument_threshold,
        prompt_format=fmt,
        include_tokens=req.wants_logprobs,
        constrained_logprobs=constrained,
        watch=watch,
    )
    record = decided.record
    if calls and not decided.withheld:
        ids = [call_id() for _ in calls]
        with_ids = [{**c, "id": i} for c, i in zip(decided.calls, ids, strict=True)]
        record = record.model_copy(update={"tool_calls": with_ids})
        message = tool_call_message(
            [(i, c.name, c.arguments_text) for i, c in zip(ids, calls, strict=True)],
            decided.text or None,
        )
    else:
        message = {"role": "assistant", "content": decided.text, "refusal": None}
    return _reply(service, req, answer, message, decided.finish_reason, record, prompt)


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


def replay_body(body: dict[str, Any], include_usage: bool) -> Iterator[str]:
    """The finished response as stream chunks: nothing goes out before the decision (the whole
    answer is known first), then the text, the tool-call deltas and the uncertainty."""
    base = {k: body[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    choice = body["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], **more: Any) -> str:
        c = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **more}
        return sse({**base, "choices": [c]})

    def events() -> Iterator[str]:
        # the whole output's log-probs (tool-call tokens included) in the first chunk: a client
        # that adds the chunks up has every token's, as in the body
        yield chunk({"role": "assistant", "content": ""}, logprobs=choice["logprobs"])
        if message.get("content"):
            yield chunk({"content": message["content"]})
        for delta in tool_call_deltas(message):
            yield chunk(delta)
        yield chunk({}, finish_reason=choice["finish_reason"], uncertainty=choice["uncertainty"])
        if include_usage:
            yield sse({**base, "choices": [], "usage": body["usage"]})
        yield sse("[DONE]")

    return events()
