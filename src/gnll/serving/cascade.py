"""``gnll serve --policy escalate``: the local model answers, and a larger upstream model answers instead
when the local answer is likely wrong.

The local model is an in-process one (``gnll serve --model``) or a smaller model's server
(``gnll serve --upstream URL``, a :class:`~gnll.serving.proxy.ProxyService`); either way its answer
stops at the exact early decision where it can (:mod:`gnll.measures.early`: the in-process decoding
loop stops, the proxy closes the small server's stream), and the larger model's request starts as
soon as the local service returns.

The local model's greedy answer is scored as under any policy; when the policy would abstain on it
(calibrated ``p_correct`` below the fitted threshold or ``--min_p_correct``, or G-NLL above
``--threshold``) the same request goes to the upstream OpenAI-compatible server and its answer is
returned. Every choice's ``uncertainty`` says who answered (``answered_by``, ``escalated``; also the
``X-Answered-By`` header) and, after an escalation, carries the local model's numbers and text under
``local`` beside the upstream answer's own G-NLL.

Streaming: the local answer can only be sent once its G-NLL is known, so a streamed greedy request
is held until the local answer is complete and then replayed (time to first token becomes the whole
local answer's time, plus the upstream's when it escalates). A sampled request cannot escalate
(there is no G-NLL to gate on), so it streams live. If the upstream fails, the local answer is
returned with ``escalation_error`` set: nothing computed is lost.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Protocol

from gnll.measures import LogprobError
from gnll.serving.errors import HTTPError
from gnll.serving.responses import Answer, Reply
from gnll.serving.schemas import ChatCompletionRequest, CompletionRequest
from gnll.serving.service import Service
from gnll.serving.settings import ServeSettings
from gnll.serving.streams.replay import stream_chunks
from gnll.serving.uncertainty import AbstentionPolicy
from gnll.uncertainty import LocalAnswer, Uncertainty

if TYPE_CHECKING:
    from gnll.serving.metrics import Metrics

__all__ = ["CascadeService", "Upstream"]

log = logging.getLogger("gnll.serve")


class Upstream(Service, Protocol):
    """The service escalations go to (a :class:`~gnll.serving.proxy.ProxyService`): a
    :class:`~gnll.serving.service.Service` that also names its server."""

    upstream: str


class CascadeService:
    """A local service whose uncertain answers are replaced by an upstream model's.

    Parameters
    ----------
    local:
        The service that answers first (:class:`~gnll.serving.inprocess.InProcessService`, or
        a :class:`~gnll.serving.proxy.ProxyService` for a smaller model's server).
    upstream:
        A :class:`~gnll.serving.proxy.ProxyService` for the larger model's server.
    upstream_model:
        The model name sent upstream (``None``: the upstream's first listed model).
    """

    def __init__(
        self, local: Service, upstream: Upstream, upstream_model: str | None = None
    ) -> None:
        self.local = local
        self.upstream = upstream
        self.upstream_model = upstream_model
        self.mode = local.mode

    @property
    def model_name(self) -> str | None:
        return self.local.model_name

    def describe(self) -> dict[str, Any]:
        return {
            **self.local.describe(),
            "escalate_to": self.upstream.upstream,
            "escalate_model": self.upstream_model or self.upstream.model_name,
        }

    async def start(self) -> None:
        await self.local.start()
        await self.upstream.start()

    async def stop(self) -> None:
        await self.local.stop()
        await self.upstream.stop()

    async def models(self) -> list[dict[str, Any]]:
        return await self.local.models()

    async def ready(self) -> tuple[bool, dict[str, Any]]:
        """Ready when the local model is (an unreachable upstream only stops escalations)."""
        ok, facts = await self.local.ready()
        up_ok, up_facts = await self.upstream.ready()
        return ok, {**facts, "escalate_to": {**up_facts, "ok": up_ok}}

    def attach(self, metrics: Metrics) -> None:
        self.local.attach(metrics)

    async def handle(
        self, req: CompletionRequest | ChatCompletionRequest, settings: ServeSettings
    ) -> Reply:
        if req.stream and not req.greedy:  # no G-NLL, so no escalation: stream as it is decoded
            return await self.local.handle(req, settings)
        held = req.model_copy(update={"stream": False})
        reply = await self.local.handle(held, settings)
        assert reply.body is not None, "a request that is not streamed has a body"
        body = reply.body
        local_name = self.local.model_name or ""
        if not any(r.abstain for r in reply.records):
            kept = [
                r.model_copy(update={"answered_by": local_name, "escalated": False})
                for r in reply.records
            ]
            return self._finish(req, body, kept, reply.prompt)
        up_req = held.model_copy(update={"model": self.upstream_model})
        up_settings = dataclasses.replace(settings, policy=AbstentionPolicy(), early=False)
        try:
            up = await self.upstream.handle(up_req, up_settings)
        except (HTTPError, LogprobError) as exc:
            message = exc.message if isinstance(exc, HTTPError) else str(exc)
            log.warning("escalation to %s failed: %s", self.upstream.upstream, message)
            kept = [
                r.model_copy(
                    update={
                        "answered_by": local_name,
                        "escalated": False,
                        "escalation_error": message,
                    }
                )
                for r in reply.records
            ]
            return self._finish(req, body, kept, reply.prompt)
        assert up.body is not None, "a request that is not streamed has a body"
        up_name = up.body.get("model") or self.upstream_model or self.upstream.model_name
        first = reply.records[0]
        local = LocalAnswer.model_validate(
            first.to_json() | {"text": req.choice_text(body["choices"][0]), "model": local_name}
        )
        escalated = [
            r.model_copy(update={"answered_by": up_name, "escalated": True, "local": local})
            for r in up.records
        ]
        return self._finish(req, up.body, escalated, reply.prompt)

    @staticmethod
    def _finish(
        req: CompletionRequest | ChatCompletionRequest,
        body: dict[str, Any],
        records: list[Uncertainty],
        prompt: str | None,
    ) -> Reply:
        for choice, rec in zip(body["choices"], records, strict=True):
            choice["uncertainty"] = rec.to_json()
        stream = None
        if req.stream:
            # A streamed request is replayed exactly as any finished answer is (one shape for every
            # policy: a usage chunk only when ``include_usage`` asks for it).
            answers = [_answer_of(c, req) for c in body["choices"]]
            stream = stream_chunks(body, answers, chat=req.is_chat, include_usage=req.include_usage)
        return Reply(
            body=None if req.stream else body, records=records, stream=stream, prompt=prompt
        )


def _answer_of(choice: dict[str, Any], req: CompletionRequest | ChatCompletionRequest) -> Answer:
    """A finished choice as an :class:`Answer`, with the tokens its ``logprobs`` list (when the
    request asked for them), so that a replayed stream carries them piece by piece."""
    lp = choice.get("logprobs") or {}
    if req.is_chat:
        content = lp.get("content") or []
        tokens = [e["token"] for e in content]
        lps = [e["logprob"] for e in content]
    else:
        tokens, lps = list(lp.get("tokens") or []), list(lp.get("token_logprobs") or [])
    return Answer(req.choice_text(choice), choice.get("finish_reason"), tokens, lps)
