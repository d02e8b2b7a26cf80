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
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from gnll.backends.base import GenerationConfig
from gnll.backends.openai.client import ServerError
from gnll.backends.openai.parse import read_choice, to_generation
from gnll.backends.openai.servers import PROFILES, ServerProfile, profile_from_models
from gnll.backends.reasoning import reasoning_format
from gnll.measures import LogprobError
from gnll.serving import responses as R
from gnll.serving.errors import HTTPError
from gnll.serving.responses import Answer, Reply
from gnll.serving.schemas import ChatCompletionRequest, CompletionRequest
from gnll.serving.streams.replay import stream_chunks
from gnll.serving.streams.upstream import StreamedChoice
from gnll.serving.uncertainty import annotate


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
    server:
        A profile name of :data:`gnll.backends.openai.servers.PROFILES`, or ``"auto"`` to recognise
        the upstream from its ``/v1/models`` answer.
    """

    mode = "proxy"

    def __init__(
        self,
        upstream: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        server: str = "auto",
        reasoning: str | None = None,
    ) -> None:
        if not upstream.startswith(("http://", "https://")):
            raise ValueError(f"--upstream must be an http(s) URL ending in /v1, got {upstream!r}")
        self.upstream = upstream.rstrip("/")
        self._api_key = api_key
        self.timeout = float(timeout)
        self.server = server
        #: The upstream model's reasoning format (``think``, ``harmony``, ``marker:TEXT``) when
        #: its server runs no reasoning parser; with one, reasoning is recognised on its own.
        self.reasoning = reasoning
        self.profile: ServerProfile | None = None if server == "auto" else PROFILES[server]
        self.client: httpx.AsyncClient | None = None
        self.model_name: str | None = None

    def __repr__(self) -> str:
        return f"ProxyService(upstream={self.upstream!r})"

    def attach(self, metrics: Any) -> None:
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
                    _upstream_message(response.text) or f"HTTP {response.status_code}"
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
        }

    async def start(self) -> None:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(self.timeout, connect=min(10.0, self.timeout)),
            headers=headers,
            follow_redirects=False,
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )
        # The upstream may come up later; requests say so with a 502 until then.
        with contextlib.suppress(HTTPError):
            await self._detect()

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    async def _detect(self) -> ServerProfile:
        if self.profile is None or self.model_name is None:
            models = await self._call("GET", "/models")
            if self.profile is None:
                self.profile = profile_from_models(models, self.upstream)
            data = models.get("data") or []
            if data and isinstance(data[0], dict):
                self.model_name = data[0].get("id")
        return self.profile

    async def models(self) -> list[dict[str, Any]]:
        return list((await self._call("GET", "/models")).get("data") or [])

    # ------------------------------------------------------------------ upstream calls
    async def _send(self, method: str, path: str, body: Any = None, *, stream: bool = False):
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
            message = _upstream_message(text) or f"HTTP {response.status_code}"
            status = response.status_code if response.status_code < 500 else 502
            raise HTTPError(
                status,
                f"upstream {url} answered {response.status_code}: {message}",
                "upstream_error" if status == 502 else "invalid_request_error",
                param=_upstream_error(text).get("param") if status < 500 else None,
                code=_upstream_error(text).get("code") if status < 500 else None,
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
        self, req: CompletionRequest | ChatCompletionRequest, settings: Any, profile: ServerProfile
    ) -> dict[str, Any]:
        """The body sent upstream: the client's, with log-probs on and greedy decoding pinned."""
        body = req.model_dump(exclude_unset=True)
        chat = isinstance(req, ChatCompletionRequest)
        if req.max_tokens_requested() is None:
            key = profile.max_tokens_key if chat else "max_tokens"
            body[key] = settings.default_max_tokens
        if req.greedy:
            body.update(temperature=0.0, **profile.pins)
        else:
            for k, v in profile.pins.items():
                body.setdefault(k, v)
        if chat:
            # llama-cpp-python returns chat log-probs only with top_logprobs >= 1.
            body.update(logprobs=True, top_logprobs=max(req.num_top_logprobs, 1))
        else:
            body["logprobs"] = max(int(req.logprobs or 0), 1)
            for k, v in profile.extras.items():
                body.setdefault(k, v)
        if req.model is None and self.model_name:
            body["model"] = self.model_name
        return body

    async def handle(self, req: CompletionRequest | ChatCompletionRequest, settings: Any) -> Reply:
        config = req.generation_config(
            default_max_tokens=settings.default_max_tokens,
            max_tokens_limit=settings.max_tokens_limit,
        )
        profile = await self._detect()
        chat = isinstance(req, ChatCompletionRequest)
        body = self.upstream_body(req, settings, profile)
        path = "/chat/completions" if chat else "/completions"
        prompt = _prompt_text(req)
        if req.stream and settings.policy.mode != "refuse":
            response = await self._send("POST", path, body, stream=True)
            records: list[dict[str, Any]] = []  # filled when the stream ends (for metrics)
            stream = self._relay(response, req, settings, profile, config, records)
            return Reply(body=None, records=records, stream=stream, prompt=prompt)
        body["stream"] = False
        body.pop("stream_options", None)
        data = await self._call("POST", path, body)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            raise HTTPError(
                502, f"upstream {self.upstream}{path} returned no choices", "upstream_error"
            )
        answers = [self._answer(c, req, profile, config, i) for i, c in enumerate(choices)]
        records, texts, finishes = annotate(
            answers,
            settings.policy,
            include_tokens=req.wants_logprobs,
            source="upstream",
            prompt_format="chat" if chat else "text",
        )
        for choice, rec, text, finish in zip(choices, records, texts, finishes, strict=True):
            _decorate(choice, rec, text, finish, chat=chat, keep_logprobs=req.wants_logprobs)
        if req.stream:  # refuse: the answer is known before its first piece is sent
            stream = stream_chunks(
                _as_own_body(data, chat), answers, chat=chat, include_usage=req.include_usage
            )
            return Reply(body=data, records=records, stream=stream, prompt=prompt)
        return Reply(body=data, records=records, prompt=prompt)

    def _answer(
        self,
        choice: Any,
        req: Any,
        profile: ServerProfile,
        config: GenerationConfig,
        i: int,
        labels: list[Any] | None = None,
    ) -> Answer:
        try:
            raw = read_choice(choice, reasoning=self.reasoning, labels=labels)
            if raw.reasoning is not None and not raw.reasoning.marker_reported and labels:
                raise ServerError(
                    "the stream carried no token for the end-of-reasoning marker (llama.cpp sends "
                    "no chunk for a token that adds no text), so which tokens lie between trace "
                    "and answer is unknown and the answer's G-NLL cannot be aligned; ask with "
                    '"stream": false'
                )
            gen = to_generation(raw, config, eos_logprob=profile.eos_logprob, where=f"choice {i}")
        except ServerError as exc:
            raise LogprobError(f"upstream {self.upstream}: {exc}") from None
        text = (
            choice.get("text") if "text" in choice else (choice.get("message") or {}).get("content")
        )
        if gen.reasoning is not None and text and text != raw.text:
            # No reasoning parser upstream (``--reasoning`` named the format): split the text as
            # one would, the trace into ``reasoning`` beside the answer.
            trace = text[: len(text) - len(raw.text.lstrip())]
            span = reasoning_format(self.reasoning or "think").find(trace)
            where = choice["message"] if isinstance(choice.get("message"), dict) else choice
            where["reasoning"] = trace[: span[0]] if span else trace
            text = raw.text.lstrip()
        return Answer(
            text=text or "",
            finish_reason=choice.get("finish_reason"),
            tokens=gen.tokens,
            token_logprobs=gen.token_logprobs,
            decoding="greedy" if req.greedy else "sampled",
            measured_logprobs=gen.measured_logprobs,
            reasoning=gen.reasoning,
        )

    async def _relay(
        self,
        response: httpx.Response,
        req: Any,
        settings: Any,
        profile: ServerProfile,
        config: GenerationConfig,
        out: list[dict[str, Any]],
    ) -> AsyncIterator[str]:
        """Forward the upstream's stream as it comes; add a final chunk per choice with uncertainty."""
        chat = isinstance(req, ChatCompletionRequest)
        acc: dict[int, StreamedChoice] = {}
        last: dict[str, Any] = {}
        usage: dict[str, Any] | None = None  # the upstream's usage chunk goes out last
        finished = False
        try:
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    finished = True
                    break
                chunk = json.loads(payload)
                if isinstance(chunk, dict) and "error" in chunk:
                    yield R.sse(chunk)  # the upstream's own error event ends the stream
                    return
                last = chunk
                if not chunk.get("choices") and chunk.get("usage") is not None:
                    usage = chunk
                    continue
                for choice in chunk.get("choices") or []:
                    acc.setdefault(choice.get("index", 0), StreamedChoice(chat)).add(choice)
                    # A choice finishes once, in our last chunk (which carries the uncertainty):
                    # a client that stops at the first finish_reason would never see it.
                    choice["finish_reason"] = None
                    if not req.wants_logprobs:
                        choice["logprobs"] = None
                    choice.pop("uncertainty", None)  # an upstream gnll's own; ours comes last
                yield R.sse(chunk)
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            yield R.sse(R.error_body(f"upstream stream broke off: {exc}", "upstream_error"))
            return
        finally:
            await response.aclose()
        if not finished:  # the connection closed cleanly, but before the stream's end
            yield R.sse(
                R.error_body(f"upstream {self.upstream} ended the stream early", "upstream_error")
            )
            return
        try:
            answers = [
                self._answer(acc[i].choice(), req, profile, config, i, acc[i].labels)
                for i in sorted(acc)
            ]
            records, _, finishes = annotate(
                answers,
                settings.policy,
                include_tokens=req.wants_logprobs,
                source="upstream",
                prompt_format="chat" if chat else "text",
            )
        except LogprobError as exc:
            yield R.sse(R.error_body(str(exc), "upstream_error"))
            return
        out.extend(records)
        base = {k: last.get(k) for k in ("id", "object", "created", "model")}
        for i, rec, finish in zip(sorted(acc), records, finishes, strict=True):
            c = {"index": i, "logprobs": None, "finish_reason": finish, "uncertainty": rec}
            c.update({"delta": {}} if chat else {"text": ""})
            yield R.sse({**base, "choices": [c]})
        if usage is not None and req.include_usage:
            yield R.sse(usage)
        yield R.sse("[DONE]")


def _prompt_text(req: Any) -> str:
    if isinstance(req, ChatCompletionRequest):
        return "\n".join(m.text() for m in req.messages)
    return "\n".join(req.prompts)


def _upstream_error(text: str) -> dict[str, Any]:
    """The upstream's OpenAI error object (``param``, ``code``), or an empty dict."""
    try:
        err = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return {}
    return err if isinstance(err, dict) else {}


def _upstream_message(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)[:500]
    if err:
        return str(err)[:500]
    return (
        str(data.get("detail") or data.get("message") or text) if isinstance(data, dict) else text
    )[:500]


def _decorate(
    choice: dict, rec: dict, text: str, finish: Any, *, chat: bool, keep_logprobs: bool
) -> None:
    choice["uncertainty"] = rec
    choice["finish_reason"] = finish
    if chat:
        if isinstance(choice.get("message"), dict):
            choice["message"]["content"] = text
    else:
        choice["text"] = text
    if not keep_logprobs or rec.get("refused"):
        choice["logprobs"] = None


def _as_own_body(data: dict, chat: bool) -> dict:
    """An upstream body with the fields :func:`.stream_chunks` reads, filled if absent."""
    import time

    return {
        "id": data.get("id") or R.new_id("chatcmpl" if chat else "cmpl"),
        "created": data.get("created") or int(time.time()),
        "model": data.get("model"),
        "choices": data["choices"],
        "usage": data.get("usage"),
    }
