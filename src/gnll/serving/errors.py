"""Errors the serving layer turns into HTTP responses (OpenAI's error envelope)."""

from __future__ import annotations

import json
from typing import Any


class RequestError(ValueError):
    """A request gnll cannot serve as asked (HTTP 400, with this message and the parameter)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class HTTPError(Exception):
    """An error with its HTTP status and OpenAI error type (raised by services and helpers)."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param
        self.code = code


class ModelNotFound(HTTPError):
    """A request names a model this server does not serve (404 ``model_not_found``, as OpenAI)."""

    def __init__(self, requested: str, served: str | None) -> None:
        super().__init__(
            404,
            f"the model {requested!r} does not exist here; this server serves {served!r}",
            "invalid_request_error",
            "model",
            "model_not_found",
        )


def upstream_error(text: str) -> dict[str, Any]:
    """The upstream's OpenAI error object (``param``, ``code``), or an empty dict."""
    try:
        err = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return {}
    return err if isinstance(err, dict) else {}


def upstream_message(text: str) -> str:
    """The message of an upstream's error body (its OpenAI envelope, a ``detail``, or the text)."""
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
