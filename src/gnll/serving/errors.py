"""Errors the serving layer turns into HTTP responses (OpenAI's error envelope)."""

from __future__ import annotations


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
