"""Running the app: uvicorn in the foreground (``gnll serve``) or in a thread (tests, benchmarks)."""

from __future__ import annotations

import logging
import math
import socket
import sys
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def configure_logging(level: int = logging.INFO) -> None:
    """One JSON object per line on stderr for the access log; uvicorn's own access log is off."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    for name in ("gnll.serve.access", "gnll.serve"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level)
        logger.propagate = False


def uvicorn_config(
    app: FastAPI, host: str, port: int, *, graceful_timeout: float = 60.0, **kwargs: Any
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        access_log=False,
        log_level=kwargs.pop("log_level", "warning"),
        timeout_graceful_shutdown=math.ceil(graceful_timeout),
        lifespan="on",
        **kwargs,
    )


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (before a model loads: a busy port fails at once).

    Raises
    ------
    OSError
        With one line naming the address and the reason (``address already in use``).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def serve_forever(
    app: FastAPI,
    host: str,
    port: int,
    *,
    graceful_timeout: float = 60.0,
    sock: socket.socket | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM; in-flight requests finish (up to ``graceful_timeout`` s).
    ``sock``: an already bound socket (:func:`listen`)."""
    server = uvicorn.Server(
        uvicorn_config(app, host, port, graceful_timeout=graceful_timeout, log_level="info")
    )
    server.run(sockets=[sock] if sock is not None else None)


class ServerThread:
    """The app on a loopback port in a background thread, with a bounded start and a clean stop.

    Examples
    --------
    >>> from fastapi import FastAPI
    >>> with ServerThread(FastAPI()) as srv:
    ...     srv.url.startswith("http://127.0.0.1:")
    True
    """

    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int | None = None,
        start_timeout: float = 60.0,
    ) -> None:
        self.host, self.port = host, port or free_port(host)
        self.server = uvicorn.Server(uvicorn_config(app, self.host, self.port, graceful_timeout=10))
        self.thread = threading.Thread(target=self.server.run, name="gnll-serve", daemon=True)
        self.start_timeout = start_timeout

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
