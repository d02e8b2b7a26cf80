"""Request bodies of the OpenAI API that ``gnll serve`` accepts, validated at the boundary.

Only the fields gnll can honour are typed; unknown fields are kept (``extra="allow"``) so a proxy can
forward vendor extensions unchanged. Options that change what an answer *is* (``tools``,
``functions``, a ``response_format`` other than text) are refused with a 400 in both modes: G-NLL is
computed for a free-text answer. Sampling options that would change the distribution the log-probs
describe (``top_p``, penalties, ``logit_bias``) are accepted only at their neutral values by the
in-process model (:meth:`~gnll.serving.protocol.common.OpenAIRequest.check_unwarped`).

The request models themselves live with their APIs in :mod:`gnll.serving.protocol` (and are
re-exported here). A request becomes a :class:`~gnll.backends.base.GenerationConfig` in one place,
:meth:`~gnll.serving.protocol.common.OpenAIRequest.generation_config` (vLLM's ``to_sampling_params``), for both modes.

Examples
--------
>>> req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "Hi"}])
>>> req.greedy, req.max_tokens is None
(True, True)
>>> req.generation_config(default_max_tokens=16, max_tokens_limit=64).max_new_tokens
16
"""

from __future__ import annotations

from typing import Any

from gnll.serving.errors import RequestError
from gnll.serving.protocol.chat import (
    KEPT_FIELDS,
    ChatCompletionRequest,
    ChatMessage,
    chat_prompt,
)
from gnll.serving.protocol.common import UNBOUNDED, OpenAIRequest, StreamOptions
from gnll.serving.protocol.completions import CompletionRequest

__all__ = [
    "KEPT_FIELDS",
    "UNBOUNDED",
    "UNSUPPORTED",
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "OpenAIRequest",
    "StreamOptions",
    "chat_prompt",
    "check_free_text",
]

#: Request fields that ask for something other than a free-text answer (refused with a 400).
UNSUPPORTED = ("tools", "tool_choice", "functions", "function_call", "parallel_tool_calls")


def check_free_text(data: dict[str, Any], *, tools: bool = False) -> None:
    """Refuse (400) a raw request body that asks for something other than a free-text answer.

    ``tools``: the service answers chat requests with tools and ``response_format`` JSON
    (the in-process model: :mod:`gnll.serving.tools`); they are checked there."""
    if tools and "messages" in data:
        return
    for name in UNSUPPORTED:
        value = data.get(name)
        if value and value != "none":  # an empty list, false or "none" asks for nothing
            raise RequestError(f"{name} is not supported: gnll serve answers in free text", name)
    fmt = data.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise RequestError(
            'response_format is not supported (only {"type": "text"}): gnll serve answers in '
            "free text",
            "response_format",
        )
