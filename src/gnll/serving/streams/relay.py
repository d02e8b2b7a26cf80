"""The proxy's live relay: an upstream's stream forwarded as it comes, and a last chunk per choice
with its ``uncertainty``.

:class:`UpstreamAnswers` reads and annotates an upstream's answers for one request (a whole
response's choices or a stream's reassembled ones); :func:`relay` is the stream. The proxy
(:class:`~gnll.serving.proxy.ProxyService`) opens the upstream's stream and hands both over, so
that a caller pulling the chunks (the app, or the cascade relaying an escalated answer) never comes
back to the proxy for them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gnll.backends.base import GenerationConfig
from gnll.backends.openai.servers import ServerProfile
from gnll.measures import LogprobError
from gnll.policy import Answer, annotate
from gnll.policy.choices import choice_answer
from gnll.serving import responses as R
from gnll.serving.proxy_tools import ProxyTools
from gnll.serving.responses import Mark, Reply
from gnll.serving.schemas import ChatCompletionRequest, CompletionRequest
from gnll.serving.settings import ServeSettings
from gnll.serving.streams.replay import stream_chunks
from gnll.serving.streams.upstream import (
    UpstreamBrokeError,
    UpstreamEventError,
    UpstreamIdle,
    UpstreamStream,
)
from gnll.uncertainty import Uncertainty

__all__ = ["CUT_STREAM_HINT", "UpstreamAnswers", "relay"]

#: What a stream cut short by the upstream most likely means, per upstream.
CUT_STREAM_HINT = {
    "llama-cpp-python": "llama-cpp-python stops a running stream when another request arrives "
    "unless it is started with --interrupt_requests false",
}


@dataclass(frozen=True)
class UpstreamAnswers:
    """How one request's answers from an upstream are read and annotated.

    Attributes
    ----------
    upstream:
        The upstream's ``/v1`` root (named in errors).
    profile:
        The upstream server's profile (its end-of-sequence log-prob, its name).
    reasoning:
        The upstream model's reasoning format when its server runs no reasoning parser.
    req, settings, config:
        The request, the server's settings (the policy) and the request's generation config.
    mark:
        An escalation's: turns the records into the ones sent, given the model that answered.
    special:
        The request's tools or JSON format (:mod:`gnll.serving.proxy_tools`), else ``None``.
    """

    upstream: str
    profile: ServerProfile
    reasoning: str | None
    req: CompletionRequest | ChatCompletionRequest
    settings: ServeSettings
    config: GenerationConfig
    mark: Mark | None = None
    special: ProxyTools | None = None

    @property
    def expected(self) -> int:
        """How many choices the request asks for."""
        return self.req.num_prompts * self.req.n

    def too_few(self, got: int) -> str:
        """The message for an upstream that answered ``got`` of :attr:`expected` choices."""
        return (
            f"n={self.req.n}: the upstream server {self.upstream} answered with {got} of "
            f"{self.expected} choices (it does not support n); send separate requests instead"
        )

    def answer(self, choice: dict[str, Any], i: int, labels: list[Any] | None = None) -> Answer:
        """Choice ``i`` of a whole response (or a stream's reassembled choice) as an answer."""
        try:
            return choice_answer(
                choice,
                self.config,
                eos_logprob=self.profile.eos_logprob,
                decoding="greedy" if self.req.greedy else "sampled",
                where=f"choice {i}",
                reasoning=self.reasoning,
                labels=labels,
            )
        except LogprobError as exc:
            raise LogprobError(f"upstream {self.upstream}: {exc}") from None

    def read(self, choices: list[dict[str, Any]]) -> list[Answer]:
        """A whole response's choices as answers."""
        return [self.answer(c, i) for i, c in enumerate(choices)]

    def decided(
        self, choices: list[dict[str, Any]], model: str | None, early: Answer | None = None
    ) -> tuple[list[Answer], list[Uncertainty]]:
        """A tools / JSON request's choices decided (per call) and recorded, the records as sent
        (:meth:`ProxyTools.decide_all <gnll.serving.proxy_tools.ProxyTools.decide_all>`);
        ``early``: the one answer, cut at its call's early decision."""
        assert self.special is not None, "a request with tools or a JSON format"
        return self.special.decide_all(
            choices,
            self.answer if early is None else lambda c, i: early,
            self.req,
            self.settings,
            self.profile,
            self.config,
            self.mark,
            model,
        )

    def replay(self, sent: list[Answer]) -> Callable[[dict[str, Any], bool], Iterator[str]]:
        """How a held reply with these answers replays its body (:attr:`Reply.replay`)."""
        shape = self.req.shape
        return lambda body, usage: stream_chunks(body, sent, shape, usage)

    def annotated(
        self, answers: list[Answer], model: str | None
    ) -> tuple[list[Uncertainty], list[str], list[str | None]]:
        """The records (as sent: :attr:`mark`\\ ed), texts and finish reasons of the answers."""
        records, texts, finishes = annotate(
            answers,
            self.settings.policy,
            include_tokens=self.req.wants_logprobs,
            source="upstream",
            prompt_format=self.req.prompt_format("chat"),
        )
        return (self.mark(records, model) if self.mark is not None else records), texts, finishes


async def relay(
    reader: UpstreamStream, answers: UpstreamAnswers, reply: Reply
) -> AsyncIterator[str]:
    """Forward the upstream's stream as it comes; add a final chunk per choice with uncertainty.

    ``reply`` learns the answering model at the first chunk, an error before its event is sent,
    and the records when the stream ends (for metrics)."""
    req, upstream = answers.req, answers.upstream
    try:
        async for chunk in reader:
            if reply.model is None and isinstance(chunk.get("model"), str):
                reply.model = chunk["model"]
            for choice in chunk.get("choices") or []:
                # A choice finishes once, in our last chunk (which carries the uncertainty):
                # a client that stops at the first finish_reason would never see it.
                choice["finish_reason"] = None
                if not req.wants_logprobs:
                    choice["logprobs"] = None
                choice.pop("uncertainty", None)  # an upstream gnll's own; ours comes last
            yield R.sse(chunk)
    except UpstreamEventError as exc:  # the upstream's own error event ends the stream
        reply.error = exc.message
        yield R.sse(exc.chunk)
        return
    except UpstreamIdle as exc:
        reply.error = str(exc)
        yield R.sse(R.error_body(reply.error, "upstream_timeout"))
        return
    except UpstreamBrokeError as exc:
        reply.error = str(exc)
        yield R.sse(R.error_body(str(exc), "upstream_error"))
        return
    finally:
        await reader.aclose()
    acc = reader.choices
    if not reader.finished:  # the connection closed cleanly, but before the stream's end
        reply.error = f"upstream {upstream} ended the stream early"
        yield R.sse(R.error_body(reply.error, "upstream_error"))
        return
    cut = [i for i in sorted(acc) if acc[i].finish_reason is None]
    if cut:
        hint = CUT_STREAM_HINT.get(answers.profile.name, "it cut the answer short")
        said = sum(len(t) for t in acc[cut[0]].text)
        reply.error = (
            f"upstream {upstream} ended the stream of choice {cut[0]} without a "
            f"finish_reason after {said} characters: the answer was cut short ({hint})"
        )
        yield R.sse(R.error_body(reply.error, "upstream_error"))
        return
    if len(acc) < answers.expected:
        reply.error = answers.too_few(len(acc))
        yield R.sse(R.error_body(reply.error, "invalid_request_error", param="n"))
        return
    try:
        if answers.special is not None:  # the calls went out as they came (no policy withholds)
            whole = [acc[i].choice() for i in sorted(acc)]
            _, records = answers.decided(whole, reply.model)
            finishes = [c["finish_reason"] for c in whole]
        else:
            read = [answers.answer(acc[i].choice(), i, acc[i].labels) for i in sorted(acc)]
            records, _, finishes = answers.annotated(read, reply.model)
    except LogprobError as exc:
        reply.error = str(exc)
        yield R.sse(R.error_body(reply.error, "upstream_error"))
        return
    reply.records.extend(records)
    base = {k: reader.last.get(k) for k in ("id", "object", "created", "model")}
    for i, rec, finish in zip(sorted(acc), records, finishes, strict=True):
        yield R.sse({**base, "choices": [req.shape.last(i, finish, rec)]})
    if reader.usage_chunk is not None and req.include_usage:
        yield R.sse(reader.usage_chunk)
    yield R.sse("[DONE]")
