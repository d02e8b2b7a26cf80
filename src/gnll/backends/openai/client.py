"""The HTTP side of the server backend: one reusable client, bounded retries, secrets kept out of sight.

httpx rather than the official ``openai`` SDK: the SDK validates requests and responses against
OpenAI's own schema, which drops or rejects the vendor fields G-NLL needs (vLLM's ``return_token_ids``,
``stop_reason``, ``/tokenize``; llama.cpp's ``top_k``/``min_p``) and it retries and follows redirects
on its own terms. httpx gives a thread-safe connection pool, explicit timeouts and
``follow_redirects=False``, and leaves every byte of the JSON to us.
"""

from __future__ import annotations

import email.utils
import json
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

#: HTTP statuses worth retrying: request timeout, rate limit, and server-side failures.
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
#: Statuses whose ``Retry-After`` header is honoured.
RETRY_AFTER_STATUSES = frozenset({429, 503})
#: Permanent failures are not worth the retries of transient ones: an invalid or truncated JSON body
#: is tried twice (a body cut short by the network can come back whole), a rejected request (4xx
#: other than 408/429) once (it will be rejected again).
BODY_ATTEMPTS = 2


class ServerError(RuntimeError):
    """The server answered, but not with something usable (HTTP error, bad JSON, missing fields)."""


class ServerUnavailable(ConnectionError):
    """The server could not be reached after the retries: the run stops, nothing computed is lost."""


class ServerFailing(ServerUnavailable):
    """The same failure came back several times in a row within seconds: the stage stops at once.

    A server that answers every request with the same error (HTTP 500, invalid JSON, a timeout)
    would otherwise be retried prompt after prompt; one clear line is better than a stuck run.
    """


def resolve_api_key(api_key: str | None) -> str | None:
    """The API key: an explicit ``api_key`` model arg, else ``GNLL_API_KEY``, else ``OPENAI_API_KEY``."""
    return api_key or os.environ.get("GNLL_API_KEY") or os.environ.get("OPENAI_API_KEY") or None


def retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date), else ``None``.

    Examples
    --------
    >>> retry_after("3")
    3.0
    >>> retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0)
    10.0
    >>> retry_after("soon") is None
    True
    """
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


@dataclass
class _Failure:
    kind: str  # what makes two failures "the same": "HTTP 500", "invalid JSON", "ReadTimeout"
    message: str
    attempts: int | None = None  # at most this many in all; None: transient, max_retries + 1

    @property
    def permanent(self) -> bool:
        return self.attempts is not None


class FailureStreak:
    """Counts consecutive failures of one kind; trips after ``threshold`` of them within ``window`` s.

    Thread-safe: the requests of one stage run in a pool. Any success resets the streak, so a server
    that fails now and then never trips it; a tripped streak lets one request through after
    ``window`` seconds (the server may be back).

    Examples
    --------
    >>> streak = FailureStreak(threshold=2, window=60)
    >>> streak.record("HTTP 500"); streak.record("HTTP 500")
    False
    True
    >>> streak.tripped()
    True
    >>> streak.success(); streak.tripped()
    False
    """

    def __init__(self, threshold: int = 4, window: float = 30.0) -> None:
        if threshold < 1:
            raise ValueError(f"threshold must be >= 1, got {threshold}")
        self.threshold = int(threshold)
        self.window = float(window)
        self._lock = threading.Lock()
        self._kind: str | None = None
        self._times: list[float] = []
        self._tripped_at: float | None = None
        self.last_message = ""

    def record(self, kind: str, message: str = "") -> bool:
        """Count one failure; ``True`` when this one trips the streak."""
        now = time.monotonic()
        with self._lock:
            if kind != self._kind:
                self._kind, self._times = kind, []
            self._times = [t for t in self._times if now - t <= self.window] + [now]
            self.last_message = message or kind
            if len(self._times) >= self.threshold:
                self._tripped_at = now
                return True
            return False

    def success(self) -> None:
        with self._lock:
            self._kind, self._times, self._tripped_at = None, [], None

    def tripped(self) -> bool:
        with self._lock:
            if self._tripped_at is None:
                return False
            if time.monotonic() - self._tripped_at > self.window:  # half-open: let one through
                self._tripped_at = None
                self._times = []
                return False
            return True


class HTTPClient:
    """POST/GET JSON to one server with deadlines, bounded retries and fail-fast; the key stays hidden.

    Parameters
    ----------
    base_url:
        Server root including ``/v1`` (e.g. ``http://localhost:8000/v1``).
    api_key:
        Bearer token, or ``None``. Never stored anywhere but the client's headers, never followed
        through redirects, scrubbed from every error message.
    timeout:
        Hard deadline in seconds for one attempt, from sending the request to the last byte of the
        answer: a server that trickles bytes is cut off there, not only one that goes silent.
    max_retries:
        Retries after the first attempt for transient failures: connection errors, timeouts and
        :data:`RETRY_STATUSES`. Permanent failures (other 4xx, an invalid or truncated JSON body)
        are not: an invalid or truncated JSON body is tried :data:`BODY_ATTEMPTS` times in all,
        a rejected request once.
    backoff:
        First retry delay in seconds; doubles per retry (with jitter), capped at 10 s. A 429/503
        with ``Retry-After`` waits what the server asks instead (at most ``max_wait``).
    concurrency:
        Connection-pool size (requests in flight at once).
    fail_after:
        Stop (:class:`ServerFailing`) once this many attempts in a row failed the same way within
        ``fail_window`` seconds: every later request then fails at once with the same message,
        naming the server and the error, until ``fail_window`` seconds have passed.
    max_wait:
        The longest ``Retry-After`` honoured; a server asking for more fails the request now.

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
        fail_after: int = 4,
        fail_window: float = 30.0,
        max_wait: float = 60.0,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.base_url = base_url.rstrip("/")
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.backoff = float(backoff)
        self.max_wait = float(max_wait)
        self.streak = FailureStreak(fail_after, fail_window)
        self._secret = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._client = httpx.Client(
            headers=headers, timeout=self.timeout, limits=limits, follow_redirects=False
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

    def events(self, path: str, body: dict[str, Any]) -> list[Any]:
        """One streamed request (``"stream": true``), no retries: the server-sent events in order,
        parsed JSON (``"[DONE]"`` kept as the string). ``gnll doctor`` reads streams with it.

        Raises :class:`ServerUnavailable` when the server cannot be reached or answers an error
        status, with the key scrubbed from the message.
        """
        url = self.base_url + path
        out: list[Any] = []
        try:
            with self._client.stream("POST", url, json={**body, "stream": True}) as response:
                if response.status_code >= 400:
                    text = response.read()[:300].decode("utf-8", "replace")
                    raise ServerUnavailable(
                        self._scrub(f"{url}: HTTP {response.status_code}: {text}")
                    )
                for line in response.iter_lines():
                    if line.startswith("data:"):
                        payload = line[5:].strip()
                        out.append(payload if payload == "[DONE]" else json.loads(payload))
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            raise ServerUnavailable(self._scrub(f"{url}: {type(exc).__name__}: {exc}")) from None
        return out

    def _scrub(self, text: str) -> str:
        return text.replace(self._secret, "***") if self._secret else text

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None, *, root: bool
    ) -> dict[str, Any]:
        url = (self.root_url if root else self.base_url) + path
        attempts = 0
        wait = 0.0
        while True:
            if self.streak.tripped():
                raise ServerFailing(self._failing_message())
            if wait:
                time.sleep(wait)
            attempts += 1
            try:
                data = self._attempt(method, url, body)
            except _AttemptFailed as failed:
                f = failed.failure
                if self.streak.record(f.kind, f.message):
                    raise ServerFailing(self._failing_message()) from None
                if attempts >= min(f.attempts or self.max_retries + 1, self.max_retries + 1):
                    if f.permanent:
                        raise ServerError(f.message) from None
                    raise ServerUnavailable(
                        self._scrub(f"{url} failed after {attempts} attempts ({f.message})")
                    ) from None
                wait = failed.wait if failed.wait is not None else self._backoff(attempts)
                if wait > self.max_wait:
                    raise ServerUnavailable(
                        self._scrub(
                            f"{url} asks to retry after {wait:.0f} s (Retry-After), more than "
                            f"the {self.max_wait:.0f} s gnll waits ({f.message})"
                        )
                    ) from None
                continue
            self.streak.success()
            return data

    def _backoff(self, attempts: int) -> float:
        delay = min(10.0, self.backoff * 2 ** (attempts - 1))
        return delay * (0.75 + 0.5 * random.random())

    def _failing_message(self) -> str:
        return self._scrub(
            f"{self.base_url}: stopping after {self.streak.threshold} failures in a row within "
            f"{self.streak.window:.0f} s, all {self.streak.last_message}"
        )

    def _attempt(self, method: str, url: str, body: dict[str, Any] | None) -> dict[str, Any]:
        """One request against a hard deadline; raises :class:`_AttemptFailed` with its kind."""
        deadline = time.monotonic() + self.timeout
        try:
            with self._client.stream(method, url, json=body) as response:
                # httpx's timeouts bound each read, so a server sending a byte a second would
                # never trip them: the deadline is checked between chunks and, for a server
                # that goes silent mid-body, by a timer that closes the connection.
                timer = threading.Timer(max(0.0, deadline - time.monotonic()), response.close)
                timer.daemon = True
                timer.start()
                try:
                    chunks = []
                    for chunk in response.iter_bytes():
                        chunks.append(chunk)
                        if time.monotonic() > deadline:
                            break
                finally:
                    timer.cancel()
                content = b"".join(chunks)
        except (httpx.TimeoutException, httpx.TransportError, httpx.StreamClosed) as exc:
            if time.monotonic() >= deadline - 1e-3:
                raise self._deadline(url) from None
            kind = type(exc).__name__
            # A body cut short mid-way is a truncated answer, not an unreachable server.
            truncated = isinstance(exc, httpx.RemoteProtocolError)
            message = self._scrub(f"{url}: {kind}: {exc}")
            raise _AttemptFailed(
                _Failure(kind, message, BODY_ATTEMPTS if truncated else None)
            ) from None
        if time.monotonic() > deadline:
            raise self._deadline(url)
        return self._decode(response, content, url)

    def _deadline(self, url: str) -> _AttemptFailed:
        message = self._scrub(
            f"{url} did not finish answering within the {self.timeout:g} s deadline (timeout)"
        )
        return _AttemptFailed(_Failure("deadline", message))

    def _decode(self, response: httpx.Response, content: bytes, url: str) -> dict[str, Any]:
        status = response.status_code
        excerpt = self._scrub(content[:300].decode("utf-8", "replace").replace("\n", " "))
        if status in RETRY_STATUSES:
            wait = None
            if status in RETRY_AFTER_STATUSES:
                wait = retry_after(response.headers.get("retry-after"))
            message = self._scrub(f"HTTP {status}: {excerpt}")
            raise _AttemptFailed(_Failure(f"HTTP {status}", message), wait)
        if 300 <= status < 400:
            target = response.headers.get("location", "?")
            raise ServerError(
                self._scrub(
                    f"{url} redirects to {target}; gnll does not follow redirects (credentials "
                    "would travel with them): set base_url to the final address"
                )
            )
        if status >= 400:
            message = self._scrub(f"{url} answered HTTP {status}: {excerpt}")
            raise _AttemptFailed(_Failure(f"HTTP {status}", message, attempts=1))
        try:
            data = json.loads(content)
        except ValueError:
            message = self._scrub(f"{url} answered with invalid JSON: {excerpt}")
            raise _AttemptFailed(_Failure("invalid JSON", message, BODY_ATTEMPTS)) from None
        if not isinstance(data, dict):
            raise ServerError(f"{url} answered with JSON {type(data).__name__}, expected an object")
        return data


class _AttemptFailed(Exception):
    """One attempt's failure, classified; ``wait`` is the server's ``Retry-After`` if it sent one."""

    def __init__(self, failure: _Failure, wait: float | None = None) -> None:
        super().__init__(failure.message)
        self.failure = failure
        self.wait = wait
