"""``gnll serve``: an OpenAI-compatible server (or proxy) that puts G-NLL on every answer.

Layers: this package sits beside ``gnll.cli`` on top of the library (measures, backends,
evaluation); nothing below imports it. Modules: ``schemas`` (request bodies, and their
``GenerationConfig``), ``service`` (the interface of the two modes), ``inprocess`` and ``proxy``
(the two services), ``engine`` (dynamic batching of the in-process model), ``streams`` (live,
replayed and proxied streams), ``uncertainty`` (the ``uncertainty`` object and the abstention
policy), ``responses`` (OpenAI bodies), ``errors``, ``metrics`` (Prometheus), ``app`` (routes, auth,
limits, access log), ``webui`` (the page at ``/``), ``server`` (uvicorn).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gnll.serving.service import Service
from gnll.serving.settings import ServeSettings
from gnll.serving.uncertainty import AbstentionPolicy

if TYPE_CHECKING:
    from fastapi import FastAPI

    from gnll.backends.base import Model

__all__ = ["AbstentionPolicy", "ServeSettings", "Service", "build_inprocess_app", "create_app"]


def create_app(service: Service, settings: ServeSettings | None = None) -> FastAPI:
    """Build the FastAPI app around a service (see :mod:`gnll.serving.app`)."""
    from gnll.serving.app import create_app as _create

    return _create(service, settings)


def build_inprocess_app(
    model: Model,
    settings: ServeSettings | None = None,
    *,
    max_batch_prompts: int = 64,
    max_wait_ms: float = 200.0,
    escalate_to: str | None = None,
    escalate_model: str | None = None,
    escalate_api_key: str | None = None,
) -> FastAPI:
    """The app serving an already loaded gnll model with dynamic batching; with ``escalate_to`` (a
    ``/v1`` URL) uncertain answers go to that server instead (:mod:`gnll.serving.cascade`)."""
    from gnll.serving.engine import BatchingEngine
    from gnll.serving.inprocess import InProcessService

    settings = settings or ServeSettings()
    engine = BatchingEngine(model, max_batch_prompts=max_batch_prompts, max_wait_ms=max_wait_ms)
    service: Service = InProcessService(model, engine, prompt_format=settings.prompt_format)
    if escalate_to is not None:
        from gnll.serving.cascade import CascadeService
        from gnll.serving.proxy import ProxyService

        upstream = ProxyService(
            escalate_to, api_key=escalate_api_key, timeout=settings.upstream_timeout
        )
        service = CascadeService(service, upstream, escalate_model)
    return create_app(service, settings)
