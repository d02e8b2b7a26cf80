"""The server backend: G-NLL from OpenAI-compatible inference servers (vLLM, llama.cpp, OpenAI).

Modules: :mod:`~gnll.backends.openai.client` (HTTP, retries, secrets),
:mod:`~gnll.backends.openai.servers` (what each server needs and can give),
:mod:`~gnll.backends.openai.parse` (the three response shapes, the terminator split),
:mod:`~gnll.backends.openai.model` (the :class:`OpenAICompatModel` adapter).
"""

from gnll.backends.openai.client import HTTPClient, ServerError, ServerUnavailable
from gnll.backends.openai.model import OpenAICompatModel
from gnll.backends.openai.servers import PROFILES, ServerProfile

__all__ = [
    "PROFILES",
    "HTTPClient",
    "OpenAICompatModel",
    "ServerError",
    "ServerProfile",
    "ServerUnavailable",
]
