"""Proxy mode: ``/v1/responses`` passed through to an upstream that serves it with log-probs.

A proxy answers ``/v1/responses`` from its upstream's own ``/v1/responses`` when that route can be
scored, and translates to the upstream's ``/v1/chat/completions`` otherwise
(:mod:`gnll.serving.responses_api`); the ``X-Gnll-Served-Via`` header names the route that answered
(``responses`` or ``chat.completions``). The rule (:func:`passes_through`), as docs/serving.md
states it: the request goes to the upstream's own route when

- the upstream's profile says its ``/v1/responses`` returns the answer's token log-probs
  (:attr:`~gnll.backends.openai.servers.ServerProfile.responses_logprobs`: vLLM, not streamed) and
  the route is there (asked once, :meth:`NativeRoutes.serves`);
- the request is not streamed;
- the answer is free text: no ``tools``, no ``text.format`` (tool calls and JSON answers are
  scored on the chat path, where their log-probs are aligned per call);
- the upstream splits a reasoning model's trace itself (no ``--reasoning`` format for it);
- no exact early decision cuts the answer (the cut reads the upstream's chat stream).

The request goes up as the client sent it, with what G-NLL needs added: the answer's log-probs
(``include: ["message.output_text.logprobs"]``), plain greedy decoding when the client asked for
greedy (the profile's pins, in the upstream's names), the proxy's ``--default_max_tokens`` when the
client set no limit, and the upstream's model when the client named none. The upstream's response
comes back as it came, except for the ``uncertainty`` record on every output item, the policy's
text (``refuse``) and log-probs the client did not ask for, which are removed again. The answer is
scored from that response: its ``output_text`` log-probs are read as a chat choice's
(:func:`gnll.policy.choices.choice_answer`), so the G-NLL is the one the chat path gives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeGuard

from gnll.measures import LogprobError
from gnll.policy import annotate
from gnll.policy.choices import choice_answer
from gnll.serving.errors import HTTPError
from gnll.serving.protocol.responses import LOGPROBS_INCLUDE, ResponsesRequest
from gnll.serving.proxy import NO_STREAM_USAGE, ProxyService
from gnll.serving.responses import Reply
from gnll.serving.translation import VIA_HEADER

if TYPE_CHECKING:
    from gnll.backends.openai.servers import ServerProfile
    from gnll.serving.schemas import ChatCompletionRequest, CompletionRequest
    from gnll.serving.service import Service
    from gnll.serving.settings import ServeSettings

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
    asked: Any,
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
    if asked.stream or asked.tools or asked.chat_response_format() is not None:
        return False
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


def _choice(data: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The upstream's response as the chat choice it answers (text, trace, log-probs, finish),
    and its ``output_text`` parts (where the policy's text goes)."""
    texts: list[dict[str, Any]] = []
    trace: list[str] = []
    for item in data.get("output") or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            texts.extend(p for p in item.get("content") or [] if p.get("type") == "output_text")
        elif item.get("type") == "reasoning":
            trace.extend(str(p.get("text") or "") for p in item.get("content") or [])
    logprobs: list[dict[str, Any]] = []
    for part in texts:
        logprobs.extend(part.get("logprobs") or [])
    cut = (data.get("incomplete_details") or {}).get("reason") == "max_output_tokens"
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(str(p.get("text") or "") for p in texts),
    }
    if trace:
        message["reasoning"] = "".join(trace)
    choice = {
        "index": 0,
        "message": message,
        "logprobs": {"content": logprobs} if texts else None,
        "finish_reason": "length" if cut else "stop",
        "stop_reason": None,  # vLLM's Responses name no stop string: the answer ended at EOS
    }
    return choice, texts


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
    data = await proxy._call("POST", "/responses", body)
    choice, parts = _choice(data)
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
    model = data.get("model") if isinstance(data.get("model"), str) else None
    return Reply(
        data,
        records,
        None,
        req.prompt_text(),
        headers={VIA_HEADER: VIA_RESPONSES},
        model=model,
    )
