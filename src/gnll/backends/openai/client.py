"""The HTTP side of the server backend: one reusable client, bounded retries, secrets kept out of sight.

httpx rather than the official ``openai`` SDK: the SDK validates requests and responses against
OpenAI's own schema, which drops or rejects the vendor fields G-NLL needs (vLLM's ``return_token_ids``,
``stop_reason``, ``/tokenize``; llama.cpp's ``top_k``/``min_p``) and it retries and follows redirects
on its own terms. httpx gives a thread-safe connection pool, explicit timeouts and
``follow_redirects=False``, and leaves every byte of the JSON to us.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import httpx

#: HTTP statuses worth retrying: request timeout, rate limit, and server-side failures.
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class ServerError(RuntimeError):
    """The server answered, but not with something usable (HTTP error, bad JSON, missing fields)."""


class ServerUnavailable(ConnectionError):
    """The server could not be reached after the retries: the run stops, nothing computed is lost."""


def resolve_api_key(api_key: str | None) -> str | None:
    """The API key: an explicit ``api_key`` model arg, else ``GNLL_API_KEY``, else ``OPENAI_API_KEY``."""
    return api_key or os.environ.get("GNLL_API_KEY") or os.environ.get("OPENAI_API_KEY") or None


class HTTPClient:
    """POST/GET JSON to one server with retries and backoff; the API key never leaves the headers.

    Parameters
    ----------
    base_url:
        Server root including ``/v1`` (e.g. ``http://localhost:8000/v1``).
    api_key:
        Bearer token, or ``None``. Never stored anywhere but the client's headers, never followed
        through redirects, scrubbed from every error message.
    timeout:
        Seconds per request (connect, read and write each).
    max_retries:
        Retries after the first attempt for connection errors, timeouts and :data:`RETRY_STATUSES`.
    backoff:
        First retry delay in seconds; doubles per retry (with jitter), capped at 10 s.
    concurrency:
        Connection-pool size (requests in flight at once).

    Examples
    --------
    >>> client = HTTPClient("http://127.0.0.1:9/v1", api_key="sk-secret", timeout=1, max_retries=0)
    >>> "sk-secret" in repr(client)
    False
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        concurrency: int = 16,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self._secret = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._client = httpx.Client(
            headers=headers, timeout=timeout, limits=limits, follow_redirects=False
        )

    def __repr__(self) -> str:
        return f"HTTPClient({self.base_url!r}, api_key={'***' if self._secret else None})"

    @property
    def root_url(self) -> str:
        """The server root without a trailing ``/v1`` (vLLM's ``/tokenize`` lives there)."""
        return self.base_url[:-3] if self.base_url.endswith("/v1") else self.base_url

    def close(self) -> None:
        self._client.close()

    def post(self, path: str, body: dict[str, Any], *, root: bool = False) -> dict[str, Any]:
        return self._request("POST", path, body, root=root)

    def get(self, path: str, *, root: bool = False) -> dict[str, Any]:
        return self._request("GET", path, None, root=root)

    def _scrub(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None, *, root: bool
    ) -> dict[str, Any]:
        url = (self.root_url if root else self.base_url) + path
        last: str = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = min(10.0, self.backoff * 2 ** (attempt - 1))
                time.sleep(delay * (0.75 + 0.5 * random.random()))
            try:
                response = self._client.request(method, url, json=body)
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code in RETRY_STATUSES:
                last = f"HTTP {response.status_code}: {self._excerpt(response)}"
                continue
            return self._decode(response, url)
        raise ServerUnavailable(
            self._scrub(f"{url} failed after {self.max_retries + 1} attempts ({last})")
        )

    def _decode(self, response: httpx.Response, url: str) -> dict[str, Any]:
        if response.is_redirect:
            target = response.headers.get("location", "?")
            raise ServerError(
                self._scrub(
                    f"{url} redirects to {target}; gnll does not follow redirects (credentials "
                    "would travel with them): set base_url to the final address"
                )
            )
        if response.status_code >= 400:
            raise ServerError(
                self._scrub(
                    f"{url} answered HTTP {response.status_code}: {self._excerpt(response)}"
                )
            )
        try:
            data = response.json()
        except ValueError as exc:
            raise ServerError(
                self._scrub(f"{url} answered with invalid JSON: {self._excerpt(response)}")
            ) from exc
        if not isinstance(data, dict):
            raise ServerError(f"{url} answered with JSON {type(data).__name__}, expected an object")
        return data

    def _excerpt(self, response: httpx.Response) -> str:
        return self._scrub(response.text[:300].replace("\n", " "))
