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
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from gnll.backends.openai.parse import logprob_pairs
from gnll.measures import LogprobError
from gnll.policy import AbstentionPolicy, Answer, escalated, kept
from gnll.serving.errors import HTTPError
from gnll.serving.responses import Reply, error_body, sse, stream_error
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
            return self._finish(req, body, kept(reply.records, local_name), reply.prompt)
        # A streamed request goes upstream streamed, so that its answer reaches the client live.
        up_req = req.model_copy(update={"model": self.upstream_model})
        bound, _ = settings.token_bounds(self.local.mode)
        if req.max_tokens_requested() is None and bound is not None:
            # The larger model answers within the bound the local answer had (gnll's default).
            up_req = up_req.model_copy(update={"max_tokens": bound})
        up_settings = dataclasses.replace(settings, policy=AbstentionPolicy(), early=False)
        chunks: AsyncGenerator[str, None] | None = None
        first: str | None = None
        try:
            up = await self.upstream.handle(up_req, up_settings)
            if up.stream is not None:  # wait for its first chunk: a failure there costs nothing
                chunks = _async(up.stream)
                first = await anext(chunks, None)
        except (HTTPError, LogprobError) as exc:
            if chunks is not None:
                await chunks.aclose()
            message = exc.message if isinstance(exc, HTTPError) else str(exc)
            return self._fallback(req, body, reply, message)
        if chunks is not None and (first is None or stream_error(first) is not None):
            await chunks.aclose()
            said = (stream_error(first) if first is not None else None) or "it sent an empty stream"
            return self._fallback(req, body, reply, self._named(said))
        model = up.body.get("model") if up.body is not None else _chunk_model(first)
        up_name = model or self.upstream_model or self.upstream.model_name
        def answered(records: list[Uncertainty]) -> list[Uncertainty]:
            return escalated(
                records,
                answered_by=up_name,
                local=reply.records[0],
                local_text=req.shape.text_of(body["choices"][0]),
                local_model=local_name,
            )

        if chunks is None:
            assert up.body is not None, "a request that is not streamed has a body"
            return self._finish(req, up.body, answered(up.records), reply.prompt)
        assert first is not None
        records: list[Uncertainty] = []  # filled when the stream ends (for metrics)
        stream = self._live(first, chunks, up.records, answered, records)
        return Reply(
            body=None,
            records=records,
            stream=stream,
            prompt=reply.prompt,
            headers={"X-Answered-By": str(up_name)},
        )

    def _fallback(
        self,
        req: CompletionRequest | ChatCompletionRequest,
        body: dict[str, Any],
        reply: Reply,
        message: str,
    ) -> Reply:
        """The local answer, after a failed escalation (``escalation_error`` says why)."""
        log.warning("escalation to %s failed: %s", self.upstream.upstream, message)
        records = kept(reply.records, self.local.model_name or "", message)
        return self._finish(req, body, records, reply.prompt)

    def _named(self, message: str) -> str:
        """``message``, naming the upstream unless it does already."""
        url = self.upstream.upstream
        return message if url in message else f"upstream {url}: {message}"

    async def _live(
        self,
        first: str,
        chunks: AsyncGenerator[str, None],
        up_records: list[Uncertainty],
        answered: Callable[[list[Uncertainty]], list[Uncertainty]],
        out: list[Uncertainty],
    ) -> AsyncIterator[str]:
        """The upstream's stream as it comes, each choice's record in its last chunk made the
        escalation's; an error event after the first chunk names the upstream."""

        async def each() -> AsyncIterator[str]:
            yield first
            async for chunk in chunks:
                yield chunk

        try:
            async for chunk in each():
                said = stream_error(chunk)
                if said is not None:
                    log.warning("escalation to %s broke off: %s", self.upstream.upstream, said)
                    message = f"the escalated answer broke off: {self._named(said)}"
                    yield sse(error_body(message, "upstream_error"))
                    return
                if '"uncertainty"' in chunk and chunk.startswith("data: {"):
                    # The proxy fills its records just before it sends the chunks that carry them.
                    if not out:
                        out.extend(answered(up_records))
                    data = json.loads(chunk[6:])
                    for c in data.get("choices") or []:
                        if "uncertainty" in c:
                            c["uncertainty"] = out[c.get("index", 0)].to_json()
                    chunk = sse(data)
                yield chunk
        finally:
            await chunks.aclose()

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
            stream = stream_chunks(body, answers, req.shape, req.include_usage)
        return Reply(
            body=None if req.stream else body, records=records, stream=stream, prompt=prompt
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


def _chunk_model(chunk: str | None) -> str | None:
    """The ``model`` of one server-sent-event chunk, if it names one."""
    if chunk is None or not chunk.startswith("data: {"):
        return None
    model = json.loads(chunk[6:]).get("model")
    return model if isinstance(model, str) else None


def _answer_of(choice: dict[str, Any], req: CompletionRequest | ChatCompletionRequest) -> Answer:
    """A finished choice as an :class:`Answer`, with the tokens its ``logprobs`` list (when the
    request asked for them), so that a replayed stream carries them piece by piece."""
    pairs = logprob_pairs(choice.get("logprobs"))
    tokens, lps = [t for t, _ in pairs], [lp for _, lp in pairs]
    return Answer(req.shape.text_of(choice), choice.get("finish_reason"), tokens, lps)
