"""Proxy mode: the upstream's routes that concern no answer, forwarded unchanged.

vLLM serves ``POST /tokenize`` and ``/detokenize`` at its root, and gnll's own server backend
(``gnll doctor``, ``--model_args backend=openai``) renders chat prompts through them once
``/v1/models`` says the server is vLLM, which the proxy passes through. So the proxy forwards
them, body and status as the upstream answers (a server without them answers its own 404).
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

from gnll.serving.app import read_body
from gnll.serving.proxy import ProxyService

#: Root routes (beside ``/v1``) that go to the upstream's root as they are.
FORWARDED = ("/tokenize", "/detokenize")


def add_forwarded_routes(app: FastAPI, proxy: ProxyService) -> None:
    """Route :data:`FORWARDED` of ``app`` to ``proxy``'s upstream (auth as for ``/v1``)."""
    settings = app.state.settings

    async def forward(request: Request) -> Response:
        body = await read_body(request, settings.max_request_bytes, settings.body_timeout)
        status, content, kind = await proxy.forward_root(request.url.path, body)
        return Response(content, status_code=status, media_type=kind)

    for path in FORWARDED:
        app.add_api_route(path, forward, methods=["POST"])
