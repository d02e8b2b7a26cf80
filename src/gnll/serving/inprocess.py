"""``gnll serve --model NAME``: answer OpenAI requests with an in-process gnll model.

Requests become :class:`~gnll.backends.base.GenerationConfig` objects and go through the
:class:`~gnll.serving.engine.BatchingEngine`. Temperature 0 or unset means greedy decoding (the
answer G-NLL is defined for); a positive temperature samples from the unwarped, tempered model
distribution. Options that would warp the distribution the log-probs describe (``top_p < 1``,
penalties, ``logit_bias``) are refused with a 400 rather than ignored. ``top_logprobs`` (chat) and
``logprobs`` (completions) report each answer token's most likely alternatives under the raw
distribution, as the decoding loop computes them.

Prompt rendering (:mod:`gnll.backends.prompting`): ``/v1/completions`` prompts are ``text``, the
exact text. Chat requests are ``chat`` by default: the messages are a
:class:`~gnll.backends.base.ChatPrompt` that the model renders itself
(:meth:`~gnll.backends.base.Model.render_chat`: its chat template, or the messages' texts joined
by blank lines for a model without one), as every other gnll surface renders chat turns. With
``prompt_format="instruction"`` a chat request's one user message is a question, asked as ``gnll
ask`` asks it. Every answer's ``uncertainty`` says which format its prompt had.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, cast

from gnll.backends.base import Generation, GenerationConfig, Model, StreamingModel
from gnll.measures.early import EarlyDecision
from gnll.policy import Answer, annotate
from gnll.serving.engine import BatchingEngine
from gnll.serving.errors import ModelNotFound, RequestError
from gnll.serving.metrics import Metrics
from gnll.serving.protocol.common import Usage
from gnll.serving.responses import Reply
from gnll.serving.schemas import ChatCompletionRequest, CompletionRequest, chat_prompt
from gnll.serving.settings import ServeSettings
from gnll.serving.streams.replay import sent_answers, stream_chunks
from gnll.uncertainty import Uncertainty

__all__ = ["InProcessService", "chat_prompt", "to_answer"]


def to_answer(
    gen: Generation,
    decoding: Literal["greedy", "sampled"],
    top_logprobs: list[dict[str, float]] | None = None,
) -> Answer:
    # The text the tokens spell (a completion's leading space included), as servers return it, so
    # a client (or a gnll proxy) can line tokens up with the text; the backend's stripped text when
    # single-token decoding does not reproduce it (split multi-byte characters), with the leading
    # whitespace the tokens have (so that a stream that sent " Z" before "ürich" completed agrees).
    joined = "".join(gen.tokens)
    lead = joined[: len(joined) - len(joined.lstrip())]
    return Answer(
        text=joined if joined.strip() == gen.text else lead + gen.text,
        finish_reason="length" if gen.finish_reason == "length" else "stop",
        tokens=list(gen.tokens),
        token_logprobs=list(gen.token_logprobs),
        decoding=decoding,
        top_logprobs=top_logprobs,
        completion_tokens=len(gen.token_ids) + len(gen.terminator_token_ids),
        measured_logprobs=gen.measured_logprobs,
        early=gen.early,
        reasoning=gen.reasoning,
    )


class InProcessService:
    """Generate answers for requests with a local model through a batching engine."""

    mode = "model"
    #: Chat requests with tools or ``response_format`` JSON are answered (:mod:`gnll.serving.tools`).
    serves_tools = True

    def __init__(
        self,
        model: Model,
        engine: BatchingEngine,
        *,
        prompt_format: str = "chat",
    ) -> None:
        self.model = model
        self.engine = engine
        #: How chat requests are rendered (``completions`` prompts are always ``"text"``); the
        #: token limits come from each request's settings, as in the proxy.
        self.prompt_format = prompt_format

    @property
    def model_name(self) -> str:
        return self.model.name

    def describe(self) -> dict[str, Any]:
        top = 20 if self.engine.reports_alternatives else 0
        return {
            "mode": self.mode,
            "model": self.model_name,
            "top_logprobs": top,
            "prompt_format": {"chat": self.prompt_format, "completions": "text"},
        }

    async def ready(self) -> tuple[bool, dict[str, Any]]:
        return True, {"queued": self.engine.queued}

    def attach(self, metrics: Metrics) -> None:
        self.engine.on_batch = metrics.observe_batch

    def check_model(self, requested: str | None) -> None:
        if requested and requested != self.model_name:
            raise ModelNotFound(requested, self.model_name)

    async def start(self) -> None:
        self.engine.start()

    async def stop(self) -> None:
        self.engine.stop()

    async def models(self) -> list[dict[str, Any]]:
        return [{"id": self.model_name, "object": "model", "created": 0, "owned_by": "gnll"}]

    def prompt_tokens(self, prompt: str, raw: bool) -> int:
        """The prompt's token count as the model conditions on it (0 when the model cannot tell).

        Any model with the hooks can tell, not only one whose decoding loop serves (its
        ``capabilities.streaming``): a sliding-window model (Gemma) still counts its prompts."""
        if not isinstance(self.model, StreamingModel):
            return 0
        return len(self.model.encode([prompt], raw_prompt=raw)[0])

    def streams_live(self) -> bool:
        """Whether streamed answers go out while they are decoded (a
        :class:`~gnll.backends.base.StreamingModel`); otherwise a stream replays the finished
        answer."""
        return self.model.capabilities.streaming

    async def handle(
        self, req: CompletionRequest | ChatCompletionRequest, settings: ServeSettings
    ) -> Reply:
        """Answer a request: the response body (or its stream) and the uncertainty records."""
        if isinstance(req, ChatCompletionRequest):  # tools, JSON: gnll.serving.tools
            from gnll.serving import tools as T
            from gnll.serving.protocol.tools import ResponseFormat, ToolRequest

            chat = req
            extra = req.model_extra or {}
            fmt = ResponseFormat.of(extra)
            wanted = ToolRequest.of(extra)
            if wanted is not None:
                if fmt is not None:
                    raise RequestError("send tools or response_format JSON, not both", "tools")
                return await T.handle_tools(self, chat, settings, wanted)
            if fmt is not None:
                return await T.handle_structured(self, chat, settings, fmt)

        # While the policy holds the answer (refuse) the text is known only when the answer is
        # decided: such streams are replays. Alternatives stream live from the decoding loop,
        # which records them at every step.
        if (
            req.stream
            and not settings.policy.holds(greedy=req.greedy)
            and (not req.num_top_logprobs or self.engine.reports_alternatives)
            and self.streams_live()
        ):
            return await self._stream(req, settings)
        answers, n_prompt, prompt = await self.generate(req, settings)
        records, texts, finishes = annotate(
            answers,
            settings.policy,
            include_tokens=req.wants_logprobs,
            prompt_format=req.prompt_format(self.prompt_format),
        )
        body = req.shape.body(
            req, self.model_name, answers, texts, finishes, records, prompt_tokens=n_prompt
        )
        stream = stream_chunks(body, answers, req.shape, req.include_usage) if req.stream else None
        answers = sent_answers(body, req.shape)
        return Reply(body, records, stream, prompt, answers=answers)

    async def _stream(
        self, req: CompletionRequest | ChatCompletionRequest, settings: ServeSettings
    ) -> Reply:
        """A reply whose chunks go out as the tokens are decoded (:mod:`gnll.serving.streams.live`);
        its ``records`` fill in when the stream ends."""
        from gnll.serving.streams.live import LiveStream, relay

        config, prompts, raw = self._plan(req, settings)
        # Alternatives are recorded at each decoding step, so they stream with their tokens.
        events = self.engine.stream(prompts, config, raw=raw, top_logprobs=req.num_top_logprobs)
        # Up to the first decoded step: a request that fails before it (too long a prompt) is
        # answered with an HTTP error, as without streaming.
        first = await anext(events)
        n = config.num_sequences
        live = LiveStream(
            cast(StreamingModel, self.model),
            config.stop,
            choices=len(prompts) * n,
            n=n,
            shape=req.shape,
            logprobs=req.wants_logprobs,
            include_usage=req.include_usage,
            top_logprobs=req.num_top_logprobs,
        )
        records: list[Uncertainty] = []

        def finish(
            outs: list[list[Generation]],
        ) -> tuple[list[Answer], list[Uncertainty], list[str | None], dict[str, int]]:
            answers = self._answers(outs, config)
            recs, _, finishes = annotate(
                answers,
                settings.policy,
                include_tokens=req.wants_logprobs,
                prompt_format=req.prompt_format(self.prompt_format),
            )
            records.extend(recs)
            n_prompt = sum(self.prompt_tokens(p, raw) for p in prompts)
            return answers, recs, finishes, Usage.of(n_prompt, answers).model_dump()

        stream = relay(live, events, first, finish)
        return Reply(body=None, records=records, stream=stream, prompt=prompts[0])

    def _plan(
        self, req: CompletionRequest | ChatCompletionRequest, settings: ServeSettings
    ) -> tuple[GenerationConfig, list[str], bool]:
        """The decoding, the prompts and whether they are already rendered."""
        self.check_model(req.model)
        req.check_unwarped()
        default, limit = settings.token_bounds(self.mode)
        config = req.generation_config(default_max_tokens=default, max_tokens_limit=limit)
        prompts, raw = req.model_prompts(self.prompt_format)
        return config, prompts, raw

    def early_rule(
        self, req: CompletionRequest | ChatCompletionRequest, settings: ServeSettings
    ) -> Callable[[], EarlyDecision] | None:
        """A maker of exact early decisions for the request's answers, or ``None`` when they are
        off (``settings.decides_early``), or the policy sends every answer or cannot decide early."""
        policy = settings.policy
        if not settings.decides_early or not req.greedy:
            return None
        if policy.mode not in ("refuse", "escalate") or not policy.active:
            return None
        fmt = req.prompt_format(self.prompt_format)
        return lambda: policy.early_decision(prompt_format=fmt)

    @staticmethod
    def _answers(
        outs: list[list[Generation]],
        config: GenerationConfig,
        tops: Sequence[list[list[dict[str, float]]] | None] | None = None,
    ) -> list[Answer]:
        decoding: Literal["greedy", "sampled"] = (
            "greedy" if config.strategy == "greedy" else "sampled"
        )
        tops = tops or [None] * len(outs)
        return [
            to_answer(g, decoding, None if alts is None else alts[j])
            for gens, alts in zip(outs, tops, strict=True)
            for j, g in enumerate(gens)
        ]

    async def generate(
        self, req: CompletionRequest | ChatCompletionRequest, settings: ServeSettings
    ) -> tuple[list[Answer], int, str]:
        """The answers for a request (one per prompt x ``n``), prompt token count, rendered prompt.

        Under ``--policy refuse`` or ``escalate`` with ``settings.decides_early``, each greedy answer stops
        at its exact early decision (:meth:`early_rule`).
        """
        config, prompts, raw = self._plan(req, settings)
        # A model without a decoding loop has no alternatives to give (``/health`` says 0).
        top = req.num_top_logprobs if self.engine.reports_alternatives else 0
        decoded = await self.engine.decode(
            prompts, config, raw=raw, top_logprobs=top, early=self.early_rule(req, settings)
        )
        answers = self._answers(decoded.generations, config, decoded.top_logprobs)
        n_prompt = sum(self.prompt_tokens(p, raw) for p in prompts)
        return answers, n_prompt, prompts[0]
