"""The server backend: G-NLL from OpenAI-compatible inference servers (vLLM, llama.cpp, OpenAI).

Modules: :mod:`~gnll.backends.openai.client` (HTTP, retries, secrets),
:mod:`~gnll.backends.openai.servers` (what each server needs and can give),
:mod:`~gnll.backends.openai.parse` (the three response shapes, the terminator split),
:mod:`~gnll.backends.openai.model` (the :class:`OpenAICompatModel` adapter).
"""

from typing import Any

from gnll.backends.identity import server_identity
from gnll.backends.openai.client import HTTPClient, ServerError, ServerUnavailable
from gnll.backends.openai.model import OpenAICompatModel
from gnll.backends.openai.servers import PROFILES, ServerProfile
from gnll.backends.registry import register_backend

__all__ = [
    "PROFILES",
    "HTTPClient",
    "OpenAICompatModel",
    "ServerError",
    "ServerProfile",
    "ServerUnavailable",
]


@register_backend(
    "openai",
    requires={"base_url": "http://HOST:PORT/v1"},
    targets=(OpenAICompatModel,),
    identity=server_identity,
)
def load_openai(name: str, *, progress: bool = True, **model_args: Any) -> OpenAICompatModel:
    """The ``"openai"`` backend: ``name`` served at ``base_url`` (nothing loads locally)."""
    return OpenAICompatModel(name, **model_args)
