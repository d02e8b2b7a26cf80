"""Hard deadlines, error classes and fail-fast of the server backend against scripted bad servers.

Every server here is a raw socket script on 127.0.0.1 that misbehaves in one way (trickles bytes,
goes silent mid-body, truncates its JSON, answers 500 or 429 to everything); every test bounds its
own wall time, so a regression shows up as a failed assertion, not as a hung suite.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gnll import load_model
from gnll.backends.base import GenerationErrors
from gnll.backends.openai import ServerError, ServerUnavailable
from gnll.backends.openai.client import HTTPClient, ServerFailing

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MODELS = (FIXTURES / "vllm" / "models.json").read_bytes()
COMPLETION = (FIXTURES / "vllm" / "completion_stop_newline.json").read_bytes()

#: handler(conn, path, request number) writes whatever bytes it likes and returns.
Handler = Callable[[socket.socket, str, int], None]


def head(status: int, length: int, extra: str = "") -> bytes:
    reason = {200: "OK", 400: "Bad Request", 429: "Too Many Requests", 500: "Error"}[status]
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\n{extra}\r\n"
    ).encode()


def whole(conn: socket.socket, status: int, body: bytes, extra: str = "") -> None:
    conn.sendall(head(status, len(body), extra) + body)


class Scripted:
    """A one-thread-per-connection HTTP server on loopback that runs ``handler`` per request."""

    def __init__(self, handler: Handler, lifetime: float = 60.0) -> None:
        self.handler = handler
        self.paths: list[str] = []
        self.times: list[float] = []  # time.monotonic() of each request
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.stop_at = time.monotonic() + lifetime
        self.thread = threading.Thread(target=self._loop, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def __enter__(self) -> Scripted:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_at = 0.0
        self.thread.join(5)
        self.sock.close()

    def _loop(self) -> None:
        while time.monotonic() < self.stop_at:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            header, _, rest = data.partition(b"\r\n\r\n")
            lines = header.decode().split("\r\n")
            length = next(
                (int(h.split(":")[1]) for h in lines if h.lower().startswith("content-length")), 0
            )
            while len(rest) < length:
                rest += conn.recv(65536)
            path = lines[0].split()[1]
            self.paths.append(path)
            self.times.append(time.monotonic())
            if path == "/v1/models":
                whole(conn, 200, MODELS)
            else:
                self.handler(conn, path, len(self.paths))
        except OSError:
            pass
        finally:
            time.sleep(0.05)
            conn.close()


def client(url: str, **kw) -> HTTPClient:
    kw.setdefault("backoff", 0.01)
    return HTTPClient(url, **kw)


def model(url: str, **kw):
    kw.setdefault("backoff", 0.01)
    return load_model("served-model", backend="openai", base_url=url, server="vllm", **kw)


def test_a_trickling_server_is_cut_off_at_the_deadline():
    def trickle(conn, path, n):
        conn.sendall(head(200, len(COMPLETION)))
        for byte in COMPLETION:  # one byte every 0.1 s: ~1 min for the whole body
            conn.sendall(bytes([byte]))
            time.sleep(0.1)

    with Scripted(trickle) as server:
        start = time.monotonic()
        with pytest.raises(ServerUnavailable, match=r"within the 1 s deadline"):
            client(server.url, timeout=1.0, max_retries=1).post("/completions", {})
        elapsed = time.monotonic() - start
    assert elapsed < 3.5, f"two 1 s attempts took {elapsed:.1f} s"


def test_a_server_that_goes_silent_mid_body_is_cut_off_at_the_deadline():
    def silent(conn, path, n):
        conn.sendall(head(200, len(COMPLETION)) + COMPLETION[:10])
        time.sleep(20)  # keeps the connection open: only the deadline ends this

    with Scripted(silent) as server:
        start = time.monotonic()
        with pytest.raises(ServerUnavailable, match="deadline"):
            client(server.url, timeout=1.0, max_retries=0).post("/completions", {})
        assert time.monotonic() - start < 2.5


def test_a_truncated_body_is_permanent_and_tried_twice_at_most():
    def truncated(conn, path, n):
        conn.sendall(head(200, len(COMPLETION)) + COMPLETION[:20])  # then the connection closes

    with Scripted(truncated) as server:
        start = time.monotonic()
        with pytest.raises(ServerError, match="RemoteProtocolError"):
            client(server.url, timeout=5.0, max_retries=5).post("/completions", {})
        assert time.monotonic() - start < 2.0
        assert len(server.paths) == 2


def test_invalid_json_is_retried_once_and_a_rejection_never():
    def invalid(conn, path, n):
        whole(conn, 200, b'{"choices": [')

    with Scripted(invalid) as server:
        with pytest.raises(ServerError, match="invalid JSON"):
            client(server.url, max_retries=5).post("/completions", {})
        assert len(server.paths) == 2

    def rejected(conn, path, n):
        whole(conn, 400, b'{"error": {"message": "prompt too long"}}')

    with Scripted(rejected) as server:
        with pytest.raises(ServerError, match="HTTP 400.*prompt too long"):
            client(server.url, max_retries=5).post("/completions", {})
        assert len(server.paths) == 1


def test_a_server_failing_every_request_stops_the_stage_in_seconds_with_one_message():
    def broken(conn, path, n):
        whole(conn, 500, b'{"error": "internal"}')

    with Scripted(broken) as server:
        m = model(server.url, concurrency=2, timeout=5, max_retries=3, backoff=0.05)
        start = time.monotonic()
        with pytest.raises(ServerFailing) as err:
            m.generate([f"question {i}" for i in range(6)])
        elapsed = time.monotonic() - start
        message = str(err.value)
        assert server.url in message and "HTTP 500" in message and "4 failures in a row" in message
        assert elapsed < 5.0, elapsed
        # the streak trips after 4 failed attempts; the other worker may have one attempt in flight
        assert len(server.paths) - 1 <= 4 + 2
        # while tripped, a new request fails at once without reaching the server
        sent = len(server.paths)
        with pytest.raises(ServerFailing):
            m.generate(["another"])
        assert len(server.paths) == sent


def test_isolated_rejections_do_not_trip_the_streak_and_other_prompts_survive():
    def some(conn, path, n):
        if n % 2:  # every other request is rejected; successes in between reset the streak
            whole(conn, 400, b'{"error": "no"}')
        else:
            whole(conn, 200, COMPLETION)

    with Scripted(some) as server:
        m = model(server.url, concurrency=1, timeout=5)
        with pytest.raises(GenerationErrors) as err:
            m.generate([f"q{i}" for i in range(8)])
        done = [r for r in err.value.results if r is not None]
        assert len(done) == 4 and len(err.value.errors) == 4


def test_retry_after_is_honoured_and_an_excessive_one_fails_now():
    def limited(conn, path, n):
        if n <= 2:  # /v1/models is request 1 only for model(); here the client posts directly
            whole(conn, 429, b'{"error": "slow down"}', "Retry-After: 1\r\n")
        else:
            whole(conn, 200, json.dumps({"ok": True}).encode())

    with Scripted(limited) as server:
        start = time.monotonic()
        assert client(server.url, max_retries=3).post("/completions", {}) == {"ok": True}
        assert time.monotonic() - start >= 1.9  # two Retry-After: 1 waits, not 0.01 s backoffs

    def forever(conn, path, n):
        whole(conn, 429, b'{"error": "quota"}', "Retry-After: 3600\r\n")

    with Scripted(forever) as server:
        start = time.monotonic()
        with pytest.raises(ServerUnavailable, match="Retry-After"):
            client(server.url, max_retries=3).post("/completions", {})
        assert time.monotonic() - start < 1.0


@pytest.mark.e2e
def test_gnll_eval_against_a_broken_server_ends_in_seconds_with_one_line(tmp_path):
    from typer.testing import CliRunner

    from gnll.cli.main import app

    def broken(conn, path, n):
        whole(conn, 500, b'{"error": "internal"}')

    with Scripted(broken) as server:
        args = ["eval", "--model", "served-model", "--tasks", "triviaqa_short", "--limit", "6",
                "--measures", "g-nll", "--output_path", str(tmp_path / "run"),
                "--model_args", f"backend=openai,base_url={server.url},server=vllm,backoff=0.05"]  # fmt: skip
        result = CliRunner().invoke(app, args)
        end = time.monotonic()
    assert result.exit_code != 0
    text = " ".join(result.output.split())
    assert "failures in a row" in text and "HTTP 500" in text and "Traceback" not in text
    # from the first request on (loading the task's data before it is not the server's doing)
    assert end - server.times[0] < 5.0, end - server.times[0]
    assert len(server.paths) <= 4 + 8  # the streak, plus what the other workers had in flight
