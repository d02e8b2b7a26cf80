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
is held until the local answer is complete (or stopped at its exact early decision). A kept answer
is then replayed; an escalated one is streamed live, each piece of the upstream's answer sent as
it arrives (the proxy's relay, :class:`~gnll.serving.proxy.ProxyService`), and the escalation
record comes in each choice's last chunk. A sampled request cannot escalate (there is no G-NLL to
gate on), so it streams live.

Failures: if the upstream fails before its first chunk (unreachable, an error status, an error
event or an empty stream), the local answer is returned with ``escalation_error`` set: nothing
computed is lost. If its stream breaks after that, the local answer can no longer be sent in its
place (the client has part of another answer), so the stream ends with an error event naming the
upstream, and no choice is given a ``finish_reason``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from gnll.measures import LogprobError
from gnll.policy import AbstentionPolicy, escalated, kept
from gnll.serving.errors import HTTPError
from gnll.serving.responses import Mark, Reply, error_body, sse
from gnll.serving.schemas import ChatCompletionRequest, CompletionRequest
from gnll.serving.service import Service
from gnll.serving.settings import ServeSettings
from gnll.serving.streams.replay import stream_chunks
from gnll.uncertainty import Uncertainty

if TYPE_CHECKING:
    from gnll.serving.metrics import Metrics

__all__ = ["CascadeService", "Upstream"]

log = logging.getLogger("gnll.serve")


class Upstream(Service, Protocol):
    """The service escalations go to (a :class:`~gnll.serving.proxy.ProxyService`): a
    :class:`~gnll.serving.service.Service` that also names its server."""

    upstream: str

    async def handle(
        self,
        req: CompletionRequest | ChatCompletionRequest,
        settings: ServeSettings,
        *,
        mark: Mark | None = None,
    ) -> Reply:
        """As :meth:`Service.handle`; ``mark`` turns the records into the ones sent, given the
        model that answered, before any is sent (in the body, a replay or a live stream's last
        chunks)."""
        ...


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
        #: Tool calls and JSON output are served when the local model serves them; a withheld
        #: call escalates as an uncertain answer does (the larger model is asked for the call).
        self.serves_tools = bool(getattr(local, "serves_tools", False))

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
        local_name = self.local.model_name or ""
        if not any(r.abstain for r in reply.records):
            return self._finish(req, reply, kept(reply.records, local_name))
        # A streamed request goes upstream streamed, so that its answer reaches the client live.
        up_req = req.model_copy(update={"model": self.upstream_model})
        if reply.replay is not None:
            # A tool call (or JSON) reply: the larger model's call is asked whole and replayed as
            # the local one would have been (its deltas, then the escalation record).
            up_req = up_req.model_copy(update={"stream": False})
        bound, _ = settings.token_bounds(self.local.mode)
        if req.max_tokens_requested() is None and bound is not None:
            # The larger model answers within the bound the local answer had (gnll's default).
            up_req = up_req.model_copy(update={"max_tokens": bound})
        up_settings = dataclasses.replace(settings, policy=AbstentionPolicy(), early=False)
        assert reply.answers is not None, "a reply with a body lists its answers"
        local_text = reply.answers[0].text

        def answered(records: list[Uncertainty], model: str | None) -> list[Uncertainty]:
            # Every choice's record says who answered instead, and what the local answer was.
            return escalated(
                records,
                answered_by=model or self.upstream_model or self.upstream.model_name,
                local=reply.records[0],
                local_text=local_text,
                local_model=local_name,
            )

        chunks: AsyncGenerator[str, None] | None = None
        first: str | None = None
        try:
            up = await self.upstream.handle(up_req, up_settings, mark=answered)
            if up.stream is not None:  # wait for its first chunk: a failure there costs nothing
                chunks = _async(up.stream)
                first = await anext(chunks, None)
        except (HTTPError, LogprobError) as exc:
            if chunks is not None:
                await chunks.aclose()
            message = exc.message if isinstance(exc, HTTPError) else str(exc)
            return self._fallback(req, reply, message)
        if chunks is not None and (first is None or up.error is not None):
            await chunks.aclose()
            return self._fallback(req, reply, self._named(up.error or "it sent an empty stream"))
        if chunks is None:
            if req.stream and reply.replay is not None and up.body is not None:
                return Reply(
                    body=None,
                    records=up.records,
                    stream=reply.replay(up.body, req.include_usage),
                    prompt=reply.prompt,
                    headers={"X-Answered-By": str(up.model or self.upstream_model or "")},
                )
            return Reply(body=up.body, records=up.records, prompt=reply.prompt)
        up_name = up.model or self.upstream_model or self.upstream.model_name
        stream = self._live(first, chunks, up)
        return Reply(
            body=None,
            records=up.records,  # filled when the stream ends (for metrics)
            stream=stream,
            prompt=reply.prompt,
            headers={"X-Answered-By": str(up_name)},
        )

    def _fallback(
        self, req: CompletionRequest | ChatCompletionRequest, reply: Reply, message: str
    ) -> Reply:
        """The local answer, after a failed escalation (``escalation_error`` says why)."""
        log.warning("escalation to %s failed: %s", self.upstream.upstream, message)
        return self._finish(req, reply, kept(reply.records, self.local.model_name or "", message))

    def _named(self, message: str) -> str:
        """``message``, naming the upstream unless it does already."""
        url = self.upstream.upstream
        return message if url in message else f"upstream {url}: {message}"

    async def _live(
        self, first: str | None, chunks: AsyncGenerator[str, None], up: Reply
    ) -> AsyncIterator[str]:
        """The upstream's stream as it comes (its records already the escalation's); an error
        event after the first chunk names the upstream."""
        try:
            chunk = first
            while chunk is not None:
                if up.error is not None:
                    log.warning("escalation to %s broke off: %s", self.upstream.upstream, up.error)
                    message = f"the escalated answer broke off: {self._named(up.error)}"
                    yield sse(error_body(message, "upstream_error"))
                    return
                yield chunk
                chunk = await anext(chunks, None)
        finally:
            await chunks.aclose()

    @staticmethod
    def _finish(
        req: CompletionRequest | ChatCompletionRequest, reply: Reply, records: list[Uncertainty]
    ) -> Reply:
        """The local reply with ``records`` (who answered), replayed when the request streams."""
        assert reply.body is not None and reply.answers is not None, "a held reply has a body"
        body = reply.body
        for choice, rec in zip(body["choices"], records, strict=True):
            choice["uncertainty"] = rec.to_json()
        stream = None
        if req.stream:
            # A streamed request is replayed exactly as any finished answer is (one shape for every
            # policy: a usage chunk only when ``include_usage`` asks for it).
            if reply.replay is not None:  # a tool call's deltas (gnll.serving.tools)
                stream = reply.replay(body, req.include_usage)
            else:
                stream = stream_chunks(body, reply.answers, req.shape, req.include_usage)
        return Reply(
            body=None if req.stream else body, records=records, stream=stream, prompt=reply.prompt
        )


async def _async(stream: Iterator[str] | AsyncIterator[str]) -> AsyncGenerator[str, None]:
    """A service's stream, sync (a replay) or async (a live relay), as an async iterator."""
    if isinstance(stream, AsyncIterator):
        try:
            async for chunk in stream:
                yield chunk
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
    else:
        for chunk in stream:
            yield chunk
