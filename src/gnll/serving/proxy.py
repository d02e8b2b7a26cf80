"""``gnll serve --upstream URL``: a proxy that adds G-NLL to any OpenAI-compatible server's answers.

The client's request goes upstream with the changes G-NLL needs: per-token log-probs switched on,
and, when the client asked for greedy decoding (temperature 0 or unset), every sampling parameter
pinned to plain greedy in the upstream's own names (:mod:`gnll.backends.openai.servers`: llama.cpp
defaults to temperature 0.8 with top-k/min-p, vLLM reads defaults from the model). The upstream's
response is returned unchanged except for the ``uncertainty`` object on each choice (and, under
``flag``/``refuse``, the finish reason / text), and log-probs the client did not ask for are removed
again. Token log-probs are read with the server backend's parser
(:mod:`gnll.backends.openai.parse`): the three response shapes and the answer/terminator split are
handled in one place for ``gnll eval`` and ``gnll serve``.

Errors: an unreachable upstream is a 502, a timeout a 504, an upstream 5xx a 502 and an upstream 4xx
the same 4xx, each with the upstream's own message.

Where an upstream silently ignores part of a request, the proxy answers as OpenAI would instead: a
model name the upstream does not list in ``/v1/models`` is a 404 ``model_not_found`` (llama.cpp
serves any name), ``n`` answered with fewer choices is a 400, and a stream that asks for
``include_usage`` from an upstream not known to send a usage chunk (llama-cpp-python never does) is
answered from a whole upstream response and replayed, so that its usage is the upstream's own count
(the prompt's tokens included, which a stream does not tell). A
stream the upstream ends without a ``finish_reason`` (llama-cpp-python cuts a running stream when
another request arrives, unless started with ``--interrupt_requests false``) ends in an error event
that says so.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import httpx

from gnll._util.validation import ParameterError
from gnll.backends.base import GenerationConfig, Model
from gnll.backends.openai.servers import PROFILES, ServerProfile, profile_from_models
from gnll.measures.early import EarlyDecision
from gnll.policy import Answer
from gnll.serving.errors import (
    HTTPError,
    ModelNotFound,
    RequestError,
    upstream_error,
    upstream_message,
)
from gnll.serving.proxy_tools import ProxyTools, refusal_named
from gnll.serving.responses import Mark, Reply
from gnll.serving.schemas import ChatCompletionRequest, CompletionRequest
from gnll.serving.settings import ServeSettings
from gnll.serving.streams.relay import UpstreamAnswers, relay
from gnll.serving.streams.replay import sent_answers, stream_chunks
from gnll.serving.streams.upstream import (
    EarlyWatch,
    UpstreamBrokeError,
    UpstreamEventError,
    UpstreamIdle,
    UpstreamStream,
)

if TYPE_CHECKING:
    from gnll.serving.metrics import Metrics

log = logging.getLogger("gnll.serve")

#: Upstreams not known to send a usage chunk in a stream when ``stream_options`` asks for one
#: (llama-cpp-python never does; an unrecognised server may not): a stream that asks is a replay.
NO_STREAM_USAGE = frozenset({"llama-cpp-python", "generic"})


class ProxyService:
    """Forward requests to ``upstream`` and annotate its answers.

    Parameters
    ----------
    upstream:
        The upstream server's ``/v1`` root, e.g. ``http://127.0.0.1:8080/v1``.
    api_key:
        Bearer token for the upstream (not the proxy's own ``--api-key``).
    timeout:
        Seconds per upstream request (504 past it).
    idle_timeout:
        Seconds an upstream stream may send nothing once it has begun (at most ``timeout``).
    server:
        A profile name of :data:`gnll.backends.openai.servers.PROFILES`, or ``"auto"`` to recognise
        the upstream from its ``/v1/models`` answer.
    """

    mode = "proxy"
    #: Chat requests with tools or a JSON ``response_format`` go upstream as they are
    #: (:mod:`gnll.serving.proxy_tools`); the upstream refuses what it cannot serve.
    serves_tools = True

    def __init__(
        self,
        upstream: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        server: str = "auto",
        reasoning: str | None = None,
        idle_timeout: float = 30.0,
    ) -> None:
        if not upstream.startswith(("http://", "https://")):
            raise ParameterError(
                "upstream", f"must be an http(s) URL ending in /v1, got {upstream!r}"
            )
        self.upstream = upstream.rstrip("/")
        self._api_key = api_key
        self.timeout = float(timeout)
        #: Seconds a stream may stay silent after its first chunk (an upstream whose engine died
        #: with the connection open sends nothing): the stream then ends in an error event.
        self.idle_timeout = min(float(idle_timeout), self.timeout)
        self.server = server
        #: The upstream model's reasoning format (``think``, ``harmony``, ``marker:TEXT``) when
        #: its server runs no reasoning parser; with one, reasoning is recognised on its own.
        self.reasoning = reasoning
        self.profile: ServerProfile | None = None if server == "auto" else PROFILES[server]
        self.client: httpx.AsyncClient | None = None
        self.model_name: str | None = None
        #: The model names the upstream lists in ``/v1/models`` (empty until it has answered).
        self.served: list[str] = []
        #: The upstream model's context length, when ``/v1/models`` says it (vLLM's
        #: ``max_model_len``): the limit a request's ``max_tokens`` meets upstream.
        self.max_model_len: int | None = None

    def __repr__(self) -> str:
        return f"ProxyService(upstream={self.upstream!r})"

    def attach(self, metrics: Metrics) -> None:
        """Nothing to report: the upstream batches on its own."""

    async def ready(self) -> tuple[bool, dict[str, Any]]:
        """Whether the upstream answers ``GET /models`` now (a few seconds at most)."""
        upstream: dict[str, Any] = {"url": self.upstream}
        try:
            assert self.client is not None, "the proxy is not started"
            response = await self.client.get(
                self.upstream + "/models", timeout=min(5.0, self.timeout)
            )
            upstream["status"] = response.status_code
            ok = response.status_code < 400
            if not ok:
                upstream["error"] = (
                    upstream_message(response.text) or f"HTTP {response.status_code}"
                )
        except httpx.HTTPError as exc:
            ok, upstream["error"] = False, f"cannot reach it: {exc or type(exc).__name__}"
        upstream["reachable"] = ok
        if ok:
            with contextlib.suppress(HTTPError):
                await self._detect()
        return ok, {"upstream": upstream}

    def describe(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "model": self.model_name,
            "upstream": self.upstream,
            "server": self.profile.name if self.profile else "unknown",
            # The token limit that applies (the proxy sets none of its own): vLLM lists it.
            "max_model_len": self.max_model_len,
        }

    async def start(self) -> None:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout, connect=min(10.0, self.timeout)),
            headers=headers,
            follow_redirects=False,
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )
        # The upstream may come up later; requests say so with a 502 until then. Said once now,
        # so that a mistyped --upstream shows at start rather than on the first request.
        try:
            await self._detect()
        except HTTPError as exc:
            log.warning(
                "the upstream %s is not reachable yet (%s): requests get a 502 and /health a 503 "
                "until it is",
                self.upstream,
                exc.message,
            )

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    async def _detect(self) -> ServerProfile:
        if self.profile is None or self.model_name is None:
            models = await self._call("GET", "/models")
            if self.profile is None:
                self.profile = profile_from_models(models, self.upstream)
            data = models.get("data") or []
            self.served = [str(m["id"]) for m in data if isinstance(m, dict) and m.get("id")]
            if self.served:
                self.model_name = self.served[0]
            lengths = [m.get("max_model_len") for m in data if isinstance(m, dict)]
            self.max_model_len = next((int(n) for n in lengths if isinstance(n, int)), None)
        return self.profile

    def check_request(self, req: CompletionRequest | ChatCompletionRequest) -> None:
        """Refuse what the upstream would silently answer otherwise: a model it does not serve
        (llama.cpp answers any name with its one model), ``n > 1`` from a server that ignores it."""
        if req.model and self.served and req.model not in self.served:
            raise ModelNotFound(req.model, ", ".join(self.served))
        profile = self.profile
        if (
            req.n > 1
            and profile is not None
            and not profile.supports_n
            and profile.name != "generic"
        ):
            raise RequestError(
                f"n={req.n}: the upstream server ({profile.name}) ignores n and answers with one "
                "choice; send separate requests instead",
                "n",
            )

    async def models(self) -> list[dict[str, Any]]:
        return list((await self._call("GET", "/models")).get("data") or [])

    async def scoring_model(self, requested: str | None) -> Model:
        """The upstream as a gnll model, for what needs teacher forcing (``/v1/decisions``)."""
        from gnll.backends.openai import OpenAICompatModel

        profile = await self._detect()
        if requested and self.served and requested not in self.served:
            raise ModelNotFound(requested, ", ".join(self.served))
        name = requested or self.model_name or ""
        return OpenAICompatModel(
            name,
            base_url=self.upstream,
            server=profile.name,
            chat=True,
            api_key=self._api_key,
            timeout=self.timeout,
            reasoning=self.reasoning,
        )

    async def forward_root(self, path: str, body: dict[str, Any]) -> tuple[int, bytes, str]:
        """POST ``body`` to ``path`` at the upstream's root (beside ``/v1``, where vLLM serves
        ``/tokenize``): its status, body and content type as they came (an unreachable upstream
        is the usual 502/504)."""
        assert self.client is not None, "the proxy is not started"
        root = self.upstream[:-3] if self.upstream.endswith("/v1") else self.upstream
        try:
            response = await self.client.post(root + path, json=body)
        except httpx.TimeoutException as exc:
            raise HTTPError(
                504, f"the upstream server {root}{path} did not answer ({exc})", "upstream_timeout"
            ) from None
        except httpx.HTTPError as exc:
            raise HTTPError(
                502, f"cannot reach the upstream server {root}{path}: {exc}", "upstream_error"
            ) from None
        kind = response.headers.get("content-type", "application/json")
        return response.status_code, response.content, kind

    # ------------------------------------------------------------------ upstream calls
    async def _send(
        self, method: str, path: str, body: Any = None, *, stream: bool = False
    ) -> httpx.Response:
        assert self.client is not None, "the proxy is not started"
        url = self.upstream + path
        try:
            request = self.client.build_request(method, url, json=body)
            response = await self.client.send(request, stream=stream)
        except httpx.TimeoutException as exc:
            raise HTTPError(
                504,
                f"the upstream server {url} did not answer within {self.timeout:g} s ({exc})",
                "upstream_timeout",
            ) from None
        except httpx.HTTPError as exc:
            raise HTTPError(
                502,
                f"cannot reach the upstream server {url}: {exc or type(exc).__name__}",
                "upstream_error",
            ) from None
        if response.status_code >= 400:
            text = (await response.aread()).decode(errors="replace")
            await response.aclose()
            message = upstream_message(text) or f"HTTP {response.status_code}"
            status = response.status_code if response.status_code < 500 else 502
            raise HTTPError(
                status,
                f"upstream {url} answered {response.status_code}: {message}",
                "upstream_error" if status == 502 else "invalid_request_error",
                param=upstream_error(text).get("param") if status < 500 else None,
                code=upstream_error(text).get("code") if status < 500 else None,
            )
        return response

    async def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        response = await self._send(method, path, body)
        try:
            data = response.json()
        except ValueError:
            raise HTTPError(
                502,
                f"upstream {self.upstream}{path} sent a body that is not JSON",
                "upstream_error",
            ) from None
        if not isinstance(data, dict):
            raise HTTPError(
                502, f"upstream {self.upstream}{path} sent a non-object JSON body", "upstream_error"
            )
        return data

    # ------------------------------------------------------------------ requests
    def upstream_body(
        self,
        req: CompletionRequest | ChatCompletionRequest,
        settings: ServeSettings,
        profile: ServerProfile,
    ) -> dict[str, Any]:
        """The body sent upstream: the client's, with log-probs on and greedy decoding pinned."""
        body = req.model_dump(exclude_unset=True)
        shape = req.shape
        default, _ = settings.token_bounds(self.mode)
        if req.max_tokens_requested() is None and default is not None:
            # Only an operator's --default_max_tokens: otherwise the upstream's own default holds.
            body[shape.max_tokens_key(profile)] = default
        if req.greedy:
            body.update(temperature=0.0, **profile.pins)
        else:
            for k, v in profile.pins.items():
                body.setdefault(k, v)
        shape.ask_logprobs(body, req, profile)
        if req.model is None and self.model_name:
            body["model"] = self.model_name
        return body

    async def handle(
        self,
        req: CompletionRequest | ChatCompletionRequest,
        settings: ServeSettings,
        *,
        mark: Mark | None = None,
    ) -> Reply:
        """The upstream's answer with its records; ``mark`` (an escalation's) turns the records
        into the ones sent, given the model that answered, before any is sent."""
        default, limit = settings.token_bounds(self.mode)
        config = req.generation_config(default_max_tokens=default, max_tokens_limit=limit)
        profile = await self._detect()
        self.check_request(req)
        body = self.upstream_body(req, settings, profile)
        path = req.path
        prompt = req.prompt_text()
        if getattr(req, "echo", False):
            return await self._echo(req, path, body, prompt)
        special = ProxyTools.of(req)  # tools or a JSON format: gnll.serving.proxy_tools
        answers = UpstreamAnswers(
            self.upstream, profile, self.reasoning, req, settings, config, mark, special
        )
        if special is not None:
            with refusal_named(special, profile):
                return await self._answered(answers, body, prompt)
        return await self._answered(answers, body, prompt)

    async def _answered(self, answers: UpstreamAnswers, body: dict[str, Any], prompt: str) -> Reply:
        req, settings, profile = answers.req, answers.settings, answers.profile
        path, special = req.path, answers.special
        # While the policy holds the answer (refuse), and for a usage count the upstream's stream
        # would not give, the stream is a replay of a whole upstream response.
        replay = settings.policy.holds(greedy=req.greedy) or (
            req.include_usage and profile.name in NO_STREAM_USAGE
        )
        if req.stream and not replay:
            response = await self._send("POST", path, body, stream=True)
            reader = UpstreamStream(response, req.shape, idle=(self.idle_timeout, self.upstream))
            # The relay goes on without the proxy: its records fill in when the stream ends (for
            # metrics), its model at the first chunk.
            reply = Reply(body=None, records=[], prompt=prompt)
            reply.stream = relay(reader, answers, reply)
            return reply
        body["stream"] = False
        body.pop("stream_options", None)
        decided: Answer | None = None
        # A cut answer's usage is unknown to the proxy (null): when to cut is the settings' rule.
        early = settings.proxy_decides_early(profile.name not in NO_STREAM_USAGE)
        rule = None
        if early and req.greedy and answers.expected == 1:  # one answer to watch
            rule = (
                settings.policy.early_decision(
                    where=f"upstream {self.upstream}", prompt_format=req.prompt_format("chat")
                )
                if special is None
                else special.early_rule(settings)  # on its calls (None: a JSON format)
            )
        if rule is not None:
            data, decided = await self._early_call(path, body, req, rule, answers.config)
        else:
            data = await self._call("POST", path, body)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            raise HTTPError(
                502, f"upstream {self.upstream}{path} returned no choices", "upstream_error"
            )
        if len(choices) < answers.expected:
            raise RequestError(answers.too_few(len(choices)), "n")
        model = data.get("model") if isinstance(data.get("model"), str) else None
        if special is not None:
            read, records = answers.decided(choices, model, decided)
        else:
            read = [decided] if decided is not None else answers.read(choices)
            records, texts, finishes = answers.annotated(read, model)
            for choice, rec, text, finish in zip(choices, records, texts, finishes, strict=True):
                req.shape.decorate(choice, rec, text, finish, keep_logprobs=req.wants_logprobs)
        if req.stream:  # a replay: the answer is known before its first piece is sent
            own = req.shape.own_body(data)
            replayed = stream_chunks(own, read, req.shape, req.include_usage)
            return Reply(
                data, records, replayed, prompt, model=model, answers=sent_answers(data, req.shape)
            )
        sent = sent_answers(data, req.shape)
        reply = Reply(data, records, None, prompt, model=model, answers=sent)
        if special is not None:  # a held tool reply (a cascade's) replays its calls' deltas
            reply.replay = answers.replay(sent)
        return reply

    async def _echo(
        self,
        req: CompletionRequest | ChatCompletionRequest,
        path: str,
        body: dict[str, Any],
        prompt: str,
    ) -> Reply:
        """``echo``: the prompt's own log-probs (``gnll doctor``'s teacher-forced check). The
        answer is the prompt's continuation, scored nowhere: the upstream's response goes back as
        it came, without ``uncertainty``."""
        if req.stream:
            raise RequestError("echo is served without streaming through the proxy", "echo")
        data = await self._call("POST", path, body)
        if not req.wants_logprobs:
            for choice in data.get("choices") or []:
                if isinstance(choice, dict):
                    choice["logprobs"] = None
        return Reply(body=data, records=[], prompt=prompt)

    async def _early_call(
        self,
        path: str,
        body: dict[str, Any],
        req: CompletionRequest | ChatCompletionRequest,
        rule: EarlyDecision,
        config: GenerationConfig,
    ) -> tuple[dict[str, Any], Answer | None]:
        """The upstream's answer, streamed and cut at its exact early decision.

        The tokens of a chunk without ``finish_reason`` are answer tokens the upstream has
        released (a server holds back text that may begin a stop string), so they go to ``rule``
        (the policy's :class:`~gnll.measures.early.EarlyDecision`, or, with tools, the one on the
        calls: :meth:`ProxyTools.early_rule <gnll.serving.proxy_tools.ProxyTools.early_rule>`)
        as they arrive; once it decides, the connection is closed (vLLM and llama.cpp stop
        generating when their client goes away) and the answer so far comes back as a decided
        :class:`Answer`. Otherwise the whole streamed answer comes back as a non-streaming
        response body (and ``None``).
        """
        streamed = {**body, "stream": True}
        profile = self.profile
        if profile is not None and profile.name not in NO_STREAM_USAGE:
            # A stream that runs to its end then carries the upstream's usage, as its whole
            # response would. One cut at the decision counts the tokens received; vLLM's running
            # usage in every chunk gives its prompt's tokens too.
            streamed["stream_options"] = {"include_usage": True}
            if profile.name == "vllm":
                streamed["stream_options"]["continuous_usage_stats"] = True
        response = await self._send("POST", path, streamed, stream=True)
        watch = EarlyWatch(rule)
        reader = UpstreamStream(response, req.shape, watch, idle=(self.idle_timeout, self.upstream))
        try:
            async for _ in reader:
                pass
        except UpstreamEventError as exc:
            error = exc.chunk["error"]
            raise HTTPError(
                502, f"upstream {self.upstream} failed: {error}", "upstream_error"
            ) from None
        except UpstreamIdle as exc:
            raise HTTPError(502, str(exc), "upstream_timeout") from None
        except UpstreamBrokeError as exc:
            raise HTTPError(502, str(exc), "upstream_error") from None
        return watch.outcome(reader, config.max_new_tokens)
