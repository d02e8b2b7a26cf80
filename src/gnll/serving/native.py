"""Proxy mode: ``/v1/responses`` passed through to an upstream that serves it with log-probs.

A proxy answers ``/v1/responses`` from its upstream's own ``/v1/responses`` when that route can be
scored, and translates to the upstream's ``/v1/chat/completions`` otherwise
(:mod:`gnll.serving.responses_api`); the ``X-Gnll-Served-Via`` header names the route that answered
(``responses`` or ``chat.completions``). The rule (:func:`passes_through`), as docs/serving.md
states it: the request goes to the upstream's own route when

- the upstream's profile says its ``/v1/responses`` returns the answer's token log-probs
  (:attr:`~gnll.backends.openai.servers.ServerProfile.responses_logprobs`: vLLM) and the route is
  there (asked once, :meth:`NativeRoutes.serves`);
- a stream is not held by the policy (``refuse``: the chat path's replay);
- the answer is free text: no ``tools``, no ``text.format`` (tool calls and JSON answers are
  scored on the chat path, where their log-probs are aligned per call);
- the upstream splits a reasoning model's trace itself (no ``--reasoning`` format for it);
- no exact early decision cuts the answer (the cut reads the upstream's chat stream), and the
  service is the proxy itself (an escalating cascade asks both models through chat).

The request goes up as the client sent it, with what G-NLL needs added: the answer's log-probs
(``include: ["message.output_text.logprobs"]``), plain greedy decoding when the client asked for
greedy (the profile's pins, in the upstream's names), the proxy's ``--default_max_tokens`` when the
client set no limit, and the upstream's model when the client named none. The upstream's response
comes back as it came, except for the ``uncertainty`` record on every output item, the policy's
text (``refuse``) and log-probs the client did not ask for, which are removed again. The answer is
scored from that response: its ``output_text`` log-probs are read as a chat choice's
(:func:`gnll.backends.openai.reasoning.responses_choice`, :func:`gnll.policy.choices.choice_answer`),
so the G-NLL is the one the chat path gives. A stream is relayed as it comes; its closing events
(each item's ``.done`` events, ``response.completed``) are held until the last one, whose whole
response is scored, and then carry the record.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, TypeGuard

import httpx

from gnll.backends.openai.reasoning import responses_choice
from gnll.measures import LogprobError
from gnll.policy import annotate
from gnll.policy.choices import choice_answer
from gnll.serving.errors import HTTPError
from gnll.serving.protocol.responses import LOGPROBS_INCLUDE, ResponsesRequest
from gnll.serving.proxy import NO_STREAM_USAGE, ProxyService
from gnll.serving.responses import Reply
from gnll.serving.translation import VIA_HEADER, event

if TYPE_CHECKING:
    from gnll.backends.openai.servers import ServerProfile
    from gnll.serving.schemas import ChatCompletionRequest, CompletionRequest
    from gnll.serving.service import Service
    from gnll.serving.settings import ServeSettings
    from gnll.uncertainty import Uncertainty

#: ``X-Gnll-Served-Via`` of an answer from the upstream's own ``/v1/responses``.
VIA_RESPONSES = "responses"


class NativeRoutes:
    """Which of its own routes an upstream serves, asked once per route."""

    def __init__(self) -> None:
        self.known: dict[str, bool] = {}

    async def serves(self, proxy: ProxyService, path: str) -> bool:
        """Whether the upstream has ``path``: a body it must refuse (``input`` of the wrong type)
        is answered 400/422 by a server that has the route, 404/405 by one that has not. Nothing
        is generated. Asked once; an unreachable upstream is asked again next time."""
        if path not in self.known:
            try:
                await proxy._call("POST", path, {"input": 0, "max_output_tokens": 1})
                self.known[path] = True  # it answered an invalid body: it serves the route
            except HTTPError as exc:
                if exc.status >= 500:
                    raise
                self.known[path] = exc.status not in (404, 405)
        return self.known[path]


def passes_through(
    service: Service,
    asked: object,
    req: ChatCompletionRequest | CompletionRequest,
    settings: ServeSettings,
) -> TypeGuard[ProxyService]:
    """Whether this ``/v1/responses`` request may go to the upstream's own route (the rule in the
    module docstring; whether the upstream has the route is asked afterwards): ``service`` is then
    a proxy."""
    if not isinstance(service, ProxyService) or not isinstance(asked, ResponsesRequest):
        return False
    profile = service.profile
    if profile is None or not profile.responses_logprobs or service.reasoning is not None:
        return False
    if asked.tools or asked.chat_response_format() is not None:
        return False
    if asked.stream and settings.policy.holds(greedy=req.greedy):
        return False  # a held stream (refuse) is the chat path's replay
    early = settings.proxy_decides_early(profile.name not in NO_STREAM_USAGE)
    return not (early and req.greedy)


def upstream_body(
    raw: dict[str, Any],
    asked: ResponsesRequest,
    req: ChatCompletionRequest | CompletionRequest,
    settings: ServeSettings,
    profile: ServerProfile,
    model: str | None,
) -> dict[str, Any]:
    """The client's body with what G-NLL needs added (the module docstring)."""
    body = dict(raw)
    include = list(asked.include or [])
    if LOGPROBS_INCLUDE not in include:
        include.append(LOGPROBS_INCLUDE)
    body["include"] = include
    if req.greedy:
        body.update(temperature=0.0, **profile.pins)
    else:
        for k, v in profile.pins.items():
            body.setdefault(k, v)
    default, _ = settings.token_bounds("proxy")
    if asked.max_output_tokens is None and default is not None:
        body["max_output_tokens"] = default
    if not asked.model and model:
        body["model"] = model
    return body


def _output_texts(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``output_text`` parts of a Responses body (where the policy's text goes)."""
    return [
        part
        for item in data.get("output") or []
        if isinstance(item, dict) and item.get("type") == "message"
        for part in item.get("content") or []
        if isinstance(part, dict) and part.get("type") == "output_text"
    ]


def _scored(
    proxy: ProxyService,
    data: dict[str, Any],
    asked: ResponsesRequest,
    req: ChatCompletionRequest | CompletionRequest,
    settings: ServeSettings,
    profile: ServerProfile,
) -> Uncertainty:
    """Score a whole Responses body and decorate it in place (the module docstring): its record."""
    choice = responses_choice(data)
    default, limit = settings.token_bounds("proxy")
    config = req.generation_config(default_max_tokens=default, max_tokens_limit=limit)
    try:
        answer = choice_answer(
            choice,
            config,
            eos_logprob=profile.eos_logprob,
            decoding="greedy" if req.greedy else "sampled",
            where="the response's output_text",
        )
    except LogprobError as exc:
        raise LogprobError(f"upstream {proxy.upstream}/responses: {exc}") from None
    records, texts, _ = annotate(
        [answer],
        settings.policy,
        include_tokens=asked.wants_logprobs,
        source="upstream",
        prompt_format=req.prompt_format("chat"),
    )
    record = records[0]
    parts = _output_texts(data)
    if record.refused and parts:  # the policy's text in place of the answer's
        parts[0]["text"] = texts[0]
        for part in parts[1:]:
            part["text"] = ""
    for part in parts:
        if not asked.wants_logprobs or record.refused:
            part["logprobs"] = None
    for item in data.get("output") or []:
        if isinstance(item, dict):
            item["uncertainty"] = record.to_json()
    return record


async def responses_reply(
    proxy: ProxyService,
    raw: dict[str, Any],
    asked: ResponsesRequest,
    req: ChatCompletionRequest | CompletionRequest,
    settings: ServeSettings,
    routes: NativeRoutes,
) -> Reply | None:
    """The upstream's own ``/v1/responses`` answer, scored (``None``: the upstream has no such
    route, so the request is translated)."""
    profile = await proxy._detect()
    if not await routes.serves(proxy, "/responses"):
        return None
    proxy.check_request(req)
    body = upstream_body(raw, asked, req, settings, profile, proxy.model_name)
    headers = {VIA_HEADER: VIA_RESPONSES}
    if asked.stream:
        response = await proxy._send("POST", "/responses", body, stream=True)
        reply = Reply(None, [], None, req.prompt_text(), headers=headers)
        reply.stream = _relay(proxy, response, asked, req, settings, profile, reply)
        return reply
    data = await proxy._call("POST", "/responses", body)
    record = _scored(proxy, data, asked, req, settings, profile)
    model = data.get("model") if isinstance(data.get("model"), str) else None
    return Reply(data, [record], None, req.prompt_text(), headers=headers, model=model)


#: The events that close a streamed response's items, from the first of which on the relay holds
#: the stream until the response's last event (they carry the record, known only then).
_CLOSING = (
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.reasoning_text.done",
    "response.function_call_arguments.done",
)
_LAST = ("response.completed", "response.incomplete", "response.failed")


async def _events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of an upstream's Responses stream (``data:`` lines)."""
    async for line in response.aiter_lines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            event = json.loads(line[5:])
            if isinstance(event, dict):
                yield event


async def _relay(
    proxy: ProxyService,
    response: httpx.Response,
    asked: ResponsesRequest,
    req: ChatCompletionRequest | CompletionRequest,
    settings: ServeSettings,
    profile: ServerProfile,
    reply: Reply,
) -> AsyncIterator[str]:
    """The upstream's Responses events as they come (log-probs the client did not ask for
    removed), the closing ones held until the last event, whose whole response is scored: then
    each item's ``response.output_item.done`` and the last event carry the record."""
    held: list[dict[str, Any]] = []
    last: dict[str, Any] | None = None
    try:
        async for ev in _events(response):
            kind = str(ev.get("type"))
            if kind == "response.output_text.delta" and not asked.wants_logprobs:
                ev["logprobs"] = []
            if kind == "error":
                reply.error = str(ev.get("message"))
                yield event(kind, ev)
                return
            if reply.model is None and isinstance((ev.get("response") or {}).get("model"), str):
                reply.model = ev["response"]["model"]
            if kind in _LAST:
                last = ev
                break
            if held or kind in _CLOSING:
                held.append(ev)
            else:
                yield event(kind, ev)
    except (httpx.HTTPError, ValueError) as exc:
        reply.error = f"upstream {proxy.upstream}/responses broke off: {exc}"
        yield event("error", {"type": "error", "message": reply.error, "code": "upstream_error"})
        return
    finally:
        await response.aclose()
    if last is None:
        reply.error = f"upstream {proxy.upstream}/responses ended the stream early"
        yield event("error", {"type": "error", "message": reply.error, "code": "upstream_error"})
        return
    try:
        record = _scored(proxy, last["response"], asked, req, settings, profile)
    except LogprobError as exc:
        reply.error = str(exc)
        yield event("error", {"type": "error", "message": reply.error, "code": "upstream_error"})
        return
    reply.records.append(record)
    rec = record.to_json()
    for ev in held:
        kind = str(ev.get("type"))
        item = ev.get("item") if kind == "response.output_item.done" else None
        if isinstance(item, dict):
            item["uncertainty"] = rec
        if not asked.wants_logprobs:  # the parts of the closing events, as the response's
            parts = [ev.get("part")] + list((item or {}).get("content") or [])
            for part in parts:
                if isinstance(part, dict) and part.get("type") == "output_text":
                    part["logprobs"] = None
            if kind == "response.output_text.done":
                ev["logprobs"] = []
        yield event(kind, ev)
    yield event(str(last.get("type")), last)
