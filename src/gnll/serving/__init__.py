"""``gnll serve``: an OpenAI-compatible server (or proxy) that puts G-NLL on every answer.

Layers: this package sits beside ``gnll.cli`` on top of the library (measures, backends,
evaluation); nothing below imports it. Modules: ``schemas`` (request bodies, and their
``GenerationConfig``), ``service`` (the interface of the two modes), ``inprocess`` and ``proxy``
(the two services), ``engine`` (the queue of the in-process model in front of the library's
decoding loop, :mod:`gnll.backends.decoding`), ``streams`` (live,
replayed and proxied streams), ``cascade`` (``--policy escalate``), ``responses`` (OpenAI bodies),
``responses_api`` and ``messages_api`` (``/v1/responses`` and ``/v1/messages``, answered through
the chat path: ``translation``), ``errors``, ``observers`` (who hears of every answered request:
``metrics`` (Prometheus), the access log, ``tracing`` (OpenTelemetry)), ``app`` (routes, auth,
limits), ``webui`` (the page at ``/``), ``server`` (uvicorn). The abstention policy and the
annotation that builds each answer's :class:`gnll.uncertainty.Uncertainty` record are the
library's (:mod:`gnll.policy`, re-exported here as :class:`AbstentionPolicy`), obeyed by every
surface alike. The option rules of a server live here too (:class:`ServeSettings`,
:func:`check_escalation`), so ``gnll serve`` only parses and prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gnll._util.validation import ParameterError
from gnll.policy import AbstentionPolicy, scored_of
from gnll.serving.observers import Observer
from gnll.serving.service import Service
from gnll.serving.settings import ServeSettings

if TYPE_CHECKING:
    from fastapi import FastAPI

    from gnll.backends.base import Model

__all__ = [
    "AbstentionPolicy",
    "ServeSettings",
    "Service",
    "build_inprocess_app",
    "build_proxy_app",
    "check_escalation",
    "create_app",
]


def create_app(
    service: Service, settings: ServeSettings | None = None, *, observers: Sequence[Observer] = ()
) -> FastAPI:
    """Build the FastAPI app around a service (see :mod:`gnll.serving.app`); ``observers`` hear of
    every request's answers after the app's own (:mod:`gnll.serving.observers`)."""
    from gnll.serving.app import create_app as _create

    return _create(service, settings, observers=observers)


def check_escalation(
    settings: ServeSettings, escalate_to: str | None, *, upstream: str | None = None
) -> None:
    """Refuse (:class:`~gnll._util.validation.ParameterError`) an escalation set-up that cannot
    work: policy mode ``"escalate"`` and ``escalate_to`` go together, ``escalate_to`` is an
    http(s) URL, and in proxy mode (``upstream``: the server that answers first) it is another
    server than ``upstream``. Cheap: callers run it before loading a model
    (:func:`build_inprocess_app` and :func:`build_proxy_app` run it too)."""
    escalates = settings.policy.mode == "escalate"
    if escalates and escalate_to is None:
        raise ParameterError(
            "escalate_to",
            "is needed by mode 'escalate': the larger model's /v1 URL",
            others=("mode",),
        )
    if escalate_to is not None and not escalates:
        raise ParameterError(
            "escalate_to",
            f"needs mode 'escalate' (the policy is {settings.policy.mode!r})",
            others=("mode",),
        )
    if escalate_to is not None and not escalate_to.startswith(("http://", "https://")):
        raise ParameterError(
            "escalate_to", f"must be an http(s) URL ending in /v1, got {escalate_to!r}"
        )
    if (
        escalate_to is not None
        and upstream is not None
        and escalate_to.rstrip("/") == upstream.rstrip("/")
    ):
        raise ParameterError(
            "escalate_to",
            f"is the upstream itself ({upstream}): escalate to the larger model's server",
            others=("upstream",),
        )


def build_inprocess_app(
    model: Model,
    settings: ServeSettings | None = None,
    *,
    max_batch_prompts: int = 64,
    max_wait_ms: float = 200.0,
    escalate_to: str | None = None,
    escalate_model: str | None = None,
    escalate_api_key: str | None = None,
    observers: Sequence[Observer] = (),
) -> FastAPI:
    """The app serving an already loaded gnll model with dynamic batching; with ``escalate_to`` (a
    ``/v1`` URL) uncertain answers go to that server instead (:mod:`gnll.serving.cascade`).

    Raises :class:`~gnll._util.validation.ParameterError` for an escalation set-up that cannot work
    (:func:`check_escalation`), and for a calibration fitted on other answers than the model's
    (a reasoning model's are scored after its end-of-reasoning marker: the calibration would never
    decide). ``observers``: as :func:`create_app`'s."""
    from gnll.serving.engine import BatchingEngine
    from gnll.serving.inprocess import InProcessService

    settings = settings or ServeSettings()
    check_escalation(settings, escalate_to)
    settings.policy.check_scored(scored_of(model))
    engine = BatchingEngine(model, max_batch_prompts=max_batch_prompts, max_wait_ms=max_wait_ms)
    service: Service = InProcessService(model, engine, prompt_format=settings.prompt_format)
    if escalate_to is not None:
        from gnll.serving.cascade import CascadeService
        from gnll.serving.proxy import ProxyService

        upstream = ProxyService(
            escalate_to,
            api_key=escalate_api_key,
            timeout=settings.upstream_timeout,
            idle_timeout=settings.upstream_idle_timeout,
        )
        service = CascadeService(service, upstream, escalate_model)
    return create_app(service, settings, observers=observers)


def build_proxy_app(
    upstream: str,
    settings: ServeSettings | None = None,
    *,
    api_key: str | None = None,
    server: str = "auto",
    reasoning: str | None = None,
    escalate_to: str | None = None,
    escalate_model: str | None = None,
    observers: Sequence[Observer] = (),
) -> FastAPI:
    """The app of proxy mode: requests go to the OpenAI-compatible server at ``upstream`` (its
    ``/v1`` URL) and its answers come back with their uncertainty (:mod:`gnll.serving.proxy`).
    ``reasoning``: the upstream model's reasoning format when its server runs no reasoning
    parser (one with a parser is recognised anyway). With ``escalate_to`` (policy mode
    ``"escalate"``) the answers the policy abstains on come from that server instead
    (:mod:`gnll.serving.cascade`; ``escalate_model`` names the model there, ``api_key`` is sent
    to both servers).

    Raises :class:`~gnll._util.validation.ParameterError` for what an upstream cannot do:
    ``prompt_format`` ``"instruction"`` (the upstream renders chat requests itself), and for an
    escalation set-up that cannot work (:func:`check_escalation`). ``observers``: as
    :func:`create_app`'s.
    """
    from gnll.serving.proxy import ProxyService

    settings = settings or ServeSettings()
    if settings.prompt_format != "chat":
        raise ParameterError(
            "prompt_format",
            f"{settings.prompt_format!r} needs an in-process model: an upstream server renders "
            "chat requests itself",
        )
    check_escalation(settings, escalate_to, upstream=upstream)
    from gnll.serving.passthrough import add_forwarded_routes

    proxy = ProxyService(
        upstream,
        api_key=api_key,
        timeout=settings.upstream_timeout,
        server=server,
        reasoning=reasoning,
        idle_timeout=settings.upstream_idle_timeout,
    )
    service: Service = proxy
    if escalate_to is not None:
        from gnll.serving.cascade import CascadeService

        larger = ProxyService(
            escalate_to,
            api_key=api_key,
            timeout=settings.upstream_timeout,
            idle_timeout=settings.upstream_idle_timeout,
        )
        service = CascadeService(service, larger, escalate_model)
    app = create_app(service, settings, observers=observers)
    add_forwarded_routes(app, proxy)  # /tokenize, /detokenize: the client may take it for vLLM
    return app
