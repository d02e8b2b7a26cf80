"""What the app needs from a service: the one interface both modes implement.

:class:`~gnll.serving.inprocess.InProcessService` answers with an in-process model behind the
batching engine; :class:`~gnll.serving.proxy.ProxyService` forwards to an upstream server. The app
(:mod:`gnll.serving.app`) talks to either only through :class:`Service`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from gnll.serving.metrics import Metrics
    from gnll.serving.responses import Reply
    from gnll.serving.schemas import ChatCompletionRequest, CompletionRequest
    from gnll.serving.settings import ServeSettings


@runtime_checkable
class Service(Protocol):
    """A source of annotated answers for the app.

    Attributes
    ----------
    mode:
        ``"model"`` (in-process) or ``"proxy"``.
    model_name:
        The model answers come from (``None`` while a proxy has not reached its upstream).
    """

    mode: str

    @property
    def model_name(self) -> str | None: ...

    async def start(self) -> None:
        """Called once before the first request (engine thread, upstream client)."""

    async def stop(self) -> None:
        """Called once after the last request has been answered."""

    async def handle(
        self, req: CompletionRequest | ChatCompletionRequest, settings: ServeSettings
    ) -> Reply:
        """The response body (or its stream) and the uncertainty records of one request."""
        ...

    async def models(self) -> list[dict[str, Any]]:
        """The ``data`` of ``GET /v1/models``."""
        ...

    def describe(self) -> dict[str, Any]:
        """Set-up facts for ``/health`` and the web page (mode, model, upstream)."""
        ...

    async def ready(self) -> tuple[bool, dict[str, Any]]:
        """Whether requests can be answered now, and facts that say why not (``/health``)."""
        ...

    def attach(self, metrics: Metrics) -> None:
        """Let the service report its own measurements (batch sizes) into ``metrics``."""
