"""The FastAPI app of ``gnll serve``: OpenAI routes, auth, limits, metrics, access log, web page.

Both modes plug a *service* into the same app: :class:`~gnll.serving.inprocess.InProcessService`
(an in-process model behind the batching engine) or :class:`~gnll.serving.proxy.ProxyService` (an
upstream OpenAI-compatible server). A service has ``handle(request, settings) -> Reply``,
``models()``, ``describe()``, ``start()`` and ``stop()``.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from gnll.measures import LogprobError
from gnll.serving.engine import EngineStopped
from gnll.serving.errors import HTTPError, RequestError
from gnll.serving.metrics import Metrics
from gnll.serving.responses import Reply, error_body
from gnll.serving.schemas import ChatCompletionRequest, CompletionRequest
from gnll.serving.settings import ServeSettings
from gnll.serving.uncertainty import headers_for

access_log = logging.getLogger("gnll.serve.access")
log = logging.getLogger("gnll.serve")


def _error(status: int, message: str, type_: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param=param, code=status), status_code=status)


async def read_body(request: Request, limit: int) -> dict[str, Any]:
    """The JSON body, refusing oversized ones (413) before parsing and bad JSON with a 400."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPError(
            413,
            f"request body of {declared} bytes is above this server's limit of {limit} bytes",
            "invalid_request_error",
        )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPError(
                413,
                f"request body is above this server's limit of {limit} bytes",
                "invalid_request_error",
            )
        chunks.append(chunk)
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


async def _observed(stream: Any, records: list[dict[str, Any]], metrics: Metrics) -> Any:
    """``stream``, then the answers' metrics once ``records`` has been filled."""
    if hasattr(stream, "__aiter__"):
        async for chunk in stream:
            yield chunk
    else:
        for chunk in stream:
            yield chunk
    for record in records:
        metrics.observe_answer(record)


def create_app(service: Any, settings: ServeSettings | None = None) -> FastAPI:
    """Build the app around a service (see the module docstring)."""
    settings = settings or ServeSettings()
    metrics = Metrics()
    engine = getattr(service, "engine", None)
    if engine is not None:
        engine.on_batch = metrics.observe_batch

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.start()
        try:
            yield
        finally:
            # uvicorn has already finished in-flight requests when it gets here (graceful shutdown).
            await service.stop()

    app = FastAPI(title="gnll serve", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings, app.state.metrics, app.state.service = settings, metrics, service

    def authorised(request: Request) -> bool:
        if not settings.api_key:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(
            token.strip().encode(), settings.api_key.encode()
        )

    @app.middleware("http")
    async def access(request: Request, call_next):
        started = time.perf_counter()
        request.state.log = {}
        path = request.url.path
        protected = path.startswith(("/v1/", "/metrics", "/ui/api"))
        if protected and not authorised(request):
            response: Response = _error(
                401,
                "missing or wrong API key (send Authorization: Bearer KEY)",
                "authentication_error",
            )
        else:
            try:
                response = await call_next(request)
            except Exception:  # the handler's own errors are answered there; this is a bug
                log.exception("unhandled error on %s", path)
                response = _error(500, "internal server error", "server_error")
        seconds = time.perf_counter() - started
        endpoint = (
            path if path.startswith("/v1/") or path in ("/health", "/metrics", "/") else "other"
        )
        metrics.observe_request(endpoint, response.status_code, seconds)
        entry = {
            "event": "request",
            "id": request.state.log.pop("id", uuid.uuid4().hex[:12]),
            "method": request.method,
            "path": path,
            "status": response.status_code,
            "seconds": round(seconds, 4),
            **request.state.log,
        }
        access_log.info(json.dumps(entry, ensure_ascii=False))
        return response

    @app.exception_handler(HTTPError)
    async def _http_error(request: Request, exc: HTTPError) -> JSONResponse:
        request.state.log["error"] = exc.message
        return _error(exc.status, exc.message, exc.type, exc.param)

    async def serve(request: Request, model_cls: type) -> Response:
        raw = await read_body(request, settings.max_request_bytes)
        try:
            req = model_cls.model_validate(raw)
        except ValidationError as exc:
            message, param = _validation_message(exc)
            raise HTTPError(400, message, "invalid_request_error", param) from None
        try:
            reply: Reply = await service.handle(req, settings)
        except RequestError as exc:
            raise HTTPError(400, str(exc), "invalid_request_error", exc.param) from None
        except LogprobError as exc:
            raise HTTPError(
                502 if service.mode == "proxy" else 500, str(exc), "server_error"
            ) from None
        except EngineStopped as exc:
            raise HTTPError(503, str(exc), "server_error") from None
        info = request.state.log
        info.update(
            model=getattr(service, "model_name", None),
            stream=req.stream,
            choices=len(reply.records),
            g_nll=[r.get("g_nll") for r in reply.records],
            num_tokens=[r.get("num_tokens") for r in reply.records],
            abstain=[r.get("abstain") for r in reply.records],
        )
        if settings.log_prompts:
            info["prompt"] = reply.prompt
            if reply.body is not None:
                info["answers"] = [
                    c.get("text", (c.get("message") or {}).get("content"))
                    for c in reply.body.get("choices", [])
                ]
        for record in reply.records:
            metrics.observe_answer(record)
        headers = headers_for(reply.records) if reply.records else {}
        if reply.stream is not None:
            stream = reply.stream
            if not reply.records:  # known when the stream has ended (see gnll.serving.live)
                stream = _observed(stream, reply.records, metrics)
            return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
        return JSONResponse(reply.body, status_code=reply.status, headers=headers)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serve(request, CompletionRequest)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serve(request, ChatCompletionRequest)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": await service.models()}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        queued = engine.queued if engine is not None else None
        return {
            "status": "ok",
            **service.describe(),
            "auth": bool(settings.api_key),
            "queued": queued,
            "policy": settings.policy.describe(),
        }

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type=Metrics.content_type)

    from gnll.serving.webui import add_routes

    add_routes(app, service, settings)
    return app
