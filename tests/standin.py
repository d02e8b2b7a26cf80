"""A stand-in HTTP server for tests: 127.0.0.1, a free port, a bounded lifetime, torn down on exit."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Responder = Callable[[str, str, Any], tuple[int, Any]]


class StandIn:
    """Serve ``responder(method, path, body) -> (status, json-able or bytes)`` until closed.

    Every request is recorded in :attr:`requests` as ``(method, path, body, headers)``. The server
    shuts itself down after ``lifetime`` seconds even if a test forgets to.
    """

    def __init__(self, responder: Responder, *, lifetime: float = 300.0) -> None:
        self.requests: list[tuple[str, str, Any, dict[str, str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                outer.requests.append((method, self.path, body, dict(self.headers)))
                status, payload = responder(method, self.path, body)
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                if status in (301, 302, 307, 308):
                    self.send_header("Location", "http://127.0.0.1:9/elsewhere")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                self._serve("GET")

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                self._serve("POST")

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._timer = threading.Timer(lifetime, self.close)
        self._timer.daemon = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> StandIn:
        self._thread.start()
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._timer.cancel()
        self._httpd.shutdown()
        self._httpd.server_close()
