"""The FastAPI app of ``gnll serve``: OpenAI routes, auth, limits, metrics, access log, web page.

Both modes plug a :class:`~gnll.serving.service.Service` into the same app:
:class:`~gnll.serving.inprocess.InProcessService` (an in-process model behind the batching engine)
or :class:`~gnll.serving.proxy.ProxyService` (an upstream OpenAI-compatible server).

Every error, unknown routes included, is answered in OpenAI's error envelope. ``/health`` is the
readiness probe (503 while a proxy's upstream is unreachable); ``/live`` says only that the process
answers. A streamed request is logged (and timed) when its stream has ended, with its answers'
uncertainty.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from gnll.measures import LogprobError
from gnll.policy import headers_for
from gnll.serving.engine import EngineStopped
from gnll.serving.errors import HTTPError, RequestError
from gnll.serving.messages_api import MessagesAPI
from gnll.serving.metrics import Metrics
from gnll.serving.native import NativeRoutes, passes_through, responses_reply
from gnll.serving.observers import AccessLog, Answered, Observer, response_id_of
from gnll.serving.responses import error_body, stream_error
from gnll.serving.responses_api import ResponsesAPI
from gnll.serving.schemas import ChatCompletionRequest, CompletionRequest, check_free_text
from gnll.serving.service import Service
from gnll.serving.settings import ServeSettings
from gnll.serving.translation import TranslatedAPI

access_log = logging.getLogger("gnll.serve.access")
log = logging.getLogger("gnll.serve")

ReplyT = TypeVar("ReplyT")

#: On a response whose request gave no ``max_tokens`` and that gnll bounded with its default.
DEFAULT_MAX_TOKENS_HEADER = "X-Gnll-Default-Max-Tokens"


#: The APIs served through the chat-completions path (:mod:`gnll.serving.translation`), by route.
TRANSLATED: dict[str, TranslatedAPI[Any]] = {
    api.route: api for api in (ResponsesAPI(), MessagesAPI())
}


def api_name(path: str) -> str:
    """The API a route serves, as the access log, metrics and ``--otel`` events name it.

    Examples
    --------
    >>> api_name("/v1/chat/completions"), api_name("/v1/messages")
    ('chat.completions', 'messages')
    """
    return path.removeprefix("/v1/").strip("/").replace("/", ".")


def _error(
    status: int,
    message: str,
    type_: str,
    param: str | None = None,
    code: str | None = None,
    path: str | None = None,
) -> JSONResponse:
    api = TRANSLATED.get(path or "")
    if api is not None:  # /v1/messages answers in Anthropic's envelope
        body = api.error_body(message, type_, param, code)
    else:
        body = error_body(message, type_, param=param, code=code)
    return JSONResponse(body, status_code=status)


async def read_body(request: Request, limit: int, timeout: float = 30.0) -> dict[str, Any]:
    """The JSON body, refusing oversized ones (413) before parsing, a body that takes longer than
    ``timeout`` seconds to arrive (408: a slow sender holds a connection) and bad JSON (400)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPError(
            413,
            f"request body of {declared} bytes is above this server's limit of {limit} bytes",
            "invalid_request_error",
        )
    chunks, size = [], 0
    with anyio.move_on_after(timeout) as scope:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPError(
                    413,
                    f"request body is above this server's limit of {limit} bytes",
                    "invalid_request_error",
                )
            chunks.append(chunk)
    if scope.cancelled_caught:
        raise HTTPError(
            408,
            f"the request body did not arrive within {timeout:g} s (got {size} bytes)",
            "invalid_request_error",
        )
    try:
        data = json.loads(b"".join(chunks) or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HTTPError(
            400, f"request body is not valid JSON: {exc}", "invalid_request_error"
        ) from exc
    if not isinstance(data, dict):
        raise HTTPError(400, "request body must be a JSON object", "invalid_request_error")
    return data


def _validation_message(exc: ValidationError) -> tuple[str, str | None]:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()))
    return f"invalid request: {where}: {err.get('msg')}", where or None


async def _observed(
    stream: Iterator[str] | AsyncIterator[str],
    done: Callable[[str | None, bool, str | None], None],
) -> AsyncIterator[str]:
    """``stream``, then (once it has ended and the reply's records are filled)
    ``done(response_id, sent, error)``, also when the client went away mid-stream: ``sent`` says
    whether the stream reached its end, ``error`` is the error event that ended it, if one did (its
    HTTP status was 200, so the log line is the only place an operator finds it)."""
    sent = False
    response_id: str | None = None
    error: str | None = None
    try:
        if isinstance(stream, AsyncIterator):
            async for chunk in stream:
                response_id = response_id or response_id_of(chunk)
                error = error or stream_error(chunk)
                yield chunk
        else:
            for chunk in stream:
                response_id = response_id or response_id_of(chunk)
                error = error or stream_error(chunk)
                yield chunk
        sent = True
    finally:
        if hasattr(stream, "aclose"):  # the client left: the service frees what the stream held
            with anyio.CancelScope(shield=True):
                await stream.aclose()
        done(response_id, sent, error)


def _authorised(settings: ServeSettings, request: Request) -> bool:
    """Whether ``request`` carries the server's API key (any request, when there is none)."""
    if not settings.api_key:
        return True
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header and "x-api-key" in request.headers:  # the anthropic SDK's header
        scheme, token = "bearer", request.headers["x-api-key"]
    return scheme.lower() == "bearer" and secrets.compare_digest(
        token.strip().encode(), settings.api_key.encode()
    )


def _add_access(
    app: FastAPI, settings: ServeSettings, metrics: Metrics
) -> Callable[[Request, int, float], None]:
    """The access middleware (API key, the access log, request metrics); returns the function
    that logs a request (a stream is logged when it ends)."""

    def log_request(request: Request, status: int, started: float) -> None:
        seconds = time.perf_counter() - started
        path = request.url.path
        endpoint = (
            path
            if path.startswith("/v1/") or path in ("/health", "/live", "/metrics", "/")
            else "other"
        )
        metrics.observe_request(endpoint, status, seconds)
        entry = {
            "event": "request",
            "id": request.state.log.pop("id", uuid.uuid4().hex[:12]),
            "method": request.method,
            "path": path,
            "status": status,
            "seconds": round(seconds, 4),
            **request.state.log,
        }
        access_log.info(json.dumps(entry, ensure_ascii=False))

    @app.middleware("http")
    async def access(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        started = time.perf_counter()
        request.state.log = {}
        request.state.started = started
        request.state.deferred = False
        path = request.url.path
        protected = path.startswith(("/v1/", "/metrics", "/ui/api", "/tokenize", "/detokenize"))
        if protected and not _authorised(settings, request):
            response: Response = _error(
                401,
                "missing or wrong API key (send Authorization: Bearer KEY)",
                "authentication_error",
                path=path,
            )
        else:
            try:
                response = await call_next(request)
            except Exception:  # the handler's own errors are answered there; this is a bug
                log.exception("unhandled error on %s", path)
                response = _error(500, "internal server error", "server_error", path=path)
        if not request.state.deferred:  # a stream is logged when it ends (see _observed)
            log_request(request, response.status_code, started)
        return response

    return log_request


def _add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's envelope: the services' own, unknown routes, invalid queries."""

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError) -> JSONResponse:
        request.state.log["error"] = exc.message
        return _error(exc.status, exc.message, exc.type, exc.param, exc.code, request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _route_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown routes and methods: OpenAI's envelope, not FastAPI's {"detail": ...}.
        message = {404: f"no route {request.method} {request.url.path}"}.get(
            exc.status_code, str(exc.detail)
        )
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(exc.status_code, message, kind, path=request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _query_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        return _error(
            400,
            f"invalid request: {where}: {err.get('msg')}",
            "invalid_request_error",
            path=request.url.path,
        )


async def _handled(service: Service, call: Awaitable[ReplyT]) -> ReplyT:
    """The service's reply (``call``), its errors as HTTP errors."""
    try:
        return await call
    except RequestError as exc:
        raise HTTPError(400, str(exc), "invalid_request_error", exc.param) from None
    except LogprobError as exc:
        raise HTTPError(502 if service.mode == "proxy" else 500, str(exc), "server_error") from None
    except EngineStopped as exc:
        raise HTTPError(503, str(exc), "server_error") from None


def _request_of(
    raw: dict[str, Any],
    model_cls: type[CompletionRequest] | type[ChatCompletionRequest],
    api: TranslatedAPI[Any] | None,
    service: Service,
    settings: ServeSettings,
) -> tuple[CompletionRequest | ChatCompletionRequest, Any]:
    """The typed request of a body (and a translated API's own request), or a 400."""
    asked: Any = None
    try:
        if api is not None:  # asked as chat completions, answered in the API's own shape
            asked = api.parse(raw)
            raw = api.chat_body(asked)
        # tools and response_format JSON: native chat completions to an in-process model
        check_free_text(raw, tools=getattr(service, "serves_tools", False))
        req = model_cls.model_validate(raw)
    except ValidationError as exc:
        message, param = _validation_message(exc)
        raise HTTPError(400, message, "invalid_request_error", param) from None
    except RequestError as exc:
        raise HTTPError(400, str(exc), "invalid_request_error", exc.param) from None
    if not req.greedy and not settings.policy.takes_sampled:
        # G-NLL (and the policy's decision) exists for the greedy answer only.
        raise HTTPError(
            400,
            "temperature > 0 is not served under --policy refuse: the policy decides on the "
            "greedy answer's G-NLL",
            "invalid_request_error",
            "temperature",
        )
    return req, asked


def create_app(
    service: Service,
    settings: ServeSettings | None = None,
    *,
    observers: Sequence[Observer] = (),
) -> FastAPI:
    """Build the app around a service (see the module docstring).

    ``observers`` hear of every request's answers after the app's own (metrics, access log, the
    ``--otel`` events of ``settings.tracing``): :mod:`gnll.serving.observers`.
    """
    settings = settings or ServeSettings()
    metrics = Metrics()
    service.attach(metrics)
    listeners: list[Observer] = [metrics, AccessLog()]
    if settings.tracing is not None:  # --otel (gnll.serving.tracing)
        listeners.append(settings.tracing)
    listeners.extend(observers)

    def notify(event: Answered) -> None:
        for observer in listeners:
            observer.answered(event)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            # uvicorn has already finished in-flight requests when it gets here (graceful shutdown).
            await service.stop()

    app = FastAPI(title="gnll serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings, app.state.metrics, app.state.service = settings, metrics, service

    log_request = _add_access(app, settings, metrics)
    routes = app.state.native_routes = NativeRoutes()  # what the upstream serves itself
    _add_error_handlers(app)

    async def serve(
        request: Request,
        model_cls: type[CompletionRequest] | type[ChatCompletionRequest],
        api: TranslatedAPI[Any] | None = None,
    ) -> Response:
        raw = await read_body(request, settings.max_request_bytes, settings.body_timeout)
        req, asked = _request_of(raw, model_cls, api, service, settings)
        own = None  # the upstream's own route answered (gnll.serving.native)
        if api is not None and passes_through(service, asked, req, settings):
            own = await _handled(
                service, responses_reply(service, raw, asked, req, settings, routes)
            )
        reply = own if own is not None else await _handled(service, service.handle(req, settings))
        info = request.state.log
        info.update(model=service.model_name, stream=req.stream, api=api_name(request.url.path))
        if settings.log_prompts:
            info["prompt"] = reply.prompt
            if reply.body is not None:
                info["answers"] = [
                    c.get("text", (c.get("message") or {}).get("content"))
                    for c in reply.body.get("choices", [])
                ]
        if api is not None and own is None:
            reply = api.reply(reply, asked, req)
        headers = headers_for(reply.records) if reply.records else {}
        headers.update(reply.headers or {})
        bound, _ = settings.token_bounds(service.mode)
        if req.max_tokens_requested() is None and bound is not None:
            # gnll, not the client, bounded the answer: say so (--default_max_tokens sets it).
            headers[DEFAULT_MAX_TOKENS_HEADER] = str(bound)
        if reply.stream is not None:
            request.state.deferred = True
            records = reply.records  # a live stream's records are known when it has ended

            def done(response_id: str | None, sent: bool, error: str | None) -> None:
                notify(Answered(records, response_id, info, stream_sent=sent, stream_error=error))
                log_request(request, reply.status, request.state.started)

            stream = _observed(reply.stream, done)
            return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
        notify(Answered(reply.records, (reply.body or {}).get("id"), info))
        return JSONResponse(reply.body, status_code=reply.status, headers=headers)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serve(request, CompletionRequest)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serve(request, ChatCompletionRequest)

    def translated(api: TranslatedAPI[Any]) -> Callable[[Request], Awaitable[Response]]:
        async def route(request: Request) -> Response:
            return await serve(request, ChatCompletionRequest, api)

        return route

    for api in TRANSLATED.values():
        app.post(api.route)(translated(api))

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": await service.models()}

    @app.get("/health")
    async def health() -> JSONResponse:
        """Readiness: 200 when requests can be answered, 503 (with the reason) when not."""
        ok, facts = await service.ready()
        body = {
            "status": "ok" if ok else "unavailable",
            **service.describe(),
            **facts,
            "auth": bool(settings.api_key),
            "policy": settings.policy.describe(),
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/live")
    async def live() -> dict[str, str]:
        """Liveness: the process answers (whatever the model or upstream is doing)."""
        return {"status": "alive"}

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type=Metrics.content_type)

    from gnll.serving import decisions
    from gnll.serving.webui import add_routes

    decisions.add_routes(app, service, settings, settings.decisions_calibration)
    add_routes(app, service, settings)
    return app
