"""Stand-in OpenAI servers for ``gnll serve --upstream SMALL --policy escalate --escalate-to LARGE``
(tests/serving/test_serve_proxy_escalate.py and the tests built on it).

The small one streams a long answer one token per chunk with a pause, and notices the moment its
client goes away (between two tokens it waits on the socket, and an end-of-file there is the
disconnect), recording how many tokens it had sent; the large one records when each request arrived.
A non-streaming request to the small one takes as long as its stream (it generates the same tokens),
so a wait-for-the-end arm is timed honestly.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from fastapi import FastAPI

from gnll.serving import AbstentionPolicy, ServeSettings, build_proxy_app
from gnll.serving.server import ServerThread

LOGPROB = -0.5  # every small-model token: NLL 0.5
LARGE = ([" Paris", "."], [-0.1, -0.2])


class StandInServer:
    """A threading HTTP server on a free port, torn down by :meth:`close` (or the end of a
    ``with`` block)."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StandInHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    model = "fake"

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self.json({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    def read_body(self) -> dict[str, Any]:
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def json(self, data: Any) -> None:
        raw = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def event(self, data: Any) -> None:
        text = data if isinstance(data, str) else json.dumps(data)
        self.wfile.write(b"data: " + text.encode() + b"\n\n")
        self.wfile.flush()

    def log_message(self, *args: Any) -> None:
        pass

    def client_left(self, wait: float) -> bool:
        """Wait ``wait`` seconds for the client to close the connection (it sends nothing more,
        so a readable socket is its end of file)."""
        readable, _, _ = select.select([self.connection], [], [], wait)
        if not readable:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except ConnectionResetError:
            return True


def _choice(chat: bool, tokens: list[str], lps: list[float], finish: str | None) -> dict:
    text = "".join(tokens)
    if chat:
        content = [
            {"token": t, "logprob": lp, "top_logprobs": []}
            for t, lp in zip(tokens, lps, strict=True)
        ]
        return {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": {"content": content},
            "finish_reason": finish,
        }
    lp = {"tokens": tokens, "token_logprobs": lps}
    return {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}


def _delta(chat: bool, tokens: list[str], lps: list[float], finish: str | None) -> dict:
    c = _choice(chat, tokens, lps, finish)
    if chat:
        c["delta"] = {"content": c.pop("message")["content"]}
    return c


class SmallUpstream(StandInServer):
    """Streams ``tokens`` answer tokens (`` w0 w1 ...``), ``pause`` seconds apart, and records per
    request: tokens sent, whether (and when) the client disconnected, when it started; and, live,
    :attr:`decoded`: the tokens generated so far over all requests (streamed or not)."""

    def __init__(self, tokens: int, pause: float) -> None:
        self.tokens, self.pause = tokens, pause
        self.sent: list[int] = []
        self.disconnected: list[bool] = []
        self.started: list[float] = []
        self.ended: list[float] = []
        self.decoded = 0
        self.done = threading.Event()
        outer = self

        class Handler(StandInHandler):
            model = "small"

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = self.read_body()
                chat = self.path.endswith("/chat/completions")
                n = min(outer.tokens, body.get("max_tokens") or outer.tokens)
                toks = [f" w{i}" for i in range(n)]
                outer.started.append(time.monotonic())
                if not body.get("stream"):
                    for _ in range(n):  # the same generation time as a stream
                        time.sleep(outer.pause)
                        outer.decoded += 1
                    usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
                    c = _choice(chat, toks, [LOGPROB] * n, "length")
                    self.json({"id": "s", "model": "small", "choices": [c], "usage": usage})
                    outer.record(n, False)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                base = {"id": "s", "model": "small", "created": 1}
                base["object"] = "chat.completion.chunk" if chat else "text_completion"
                sent = 0
                try:
                    if chat:
                        role = {"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}
                        self.event({**base, "choices": [role]})
                    for tok in toks:
                        outer.decoded += 1
                        self.event({**base, "choices": [_delta(chat, [tok], [LOGPROB], None)]})
                        sent += 1
                        if self.client_left(outer.pause):
                            outer.record(sent, True)
                            return
                    self.event({**base, "choices": [_delta(chat, [], [], "length")]})
                    if (body.get("stream_options") or {}).get("include_usage"):
                        usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
                        self.event({**base, "choices": [], "usage": usage})
                    self.event("[DONE]")
                except (BrokenPipeError, ConnectionResetError):
                    outer.record(sent, True)
                    return
                outer.record(sent, False)

        super().__init__(Handler)

    def record(self, sent: int, gone: bool) -> None:
        self.sent.append(sent)
        self.disconnected.append(gone)
        self.ended.append(time.monotonic())
        self.done.set()


class LargeUpstream(StandInServer):
    """Answers `` Paris.`` after ``delay`` seconds and records when each request arrived.

    A streamed request is answered one token per chunk, ``pause`` seconds apart, and a whole one
    after as long (``tokens``:
    the answer's tokens, each of log-prob -0.1); ``fail="status"`` answers it with a 500,
    ``fail="event"`` with an error event for its first chunk, ``fail="mid"`` closes the
    connection after its first token."""

    def __init__(
        self,
        delay: float = 0.0,
        *,
        pause: float = 0.0,
        tokens: list[str] | None = None,
        fail: str | None = None,
    ) -> None:
        self.arrived: list[float] = []
        self.bodies: list[dict] = []
        self.finished: list[float] = []  # when each answer's last chunk was sent
        toks, lps = (tokens, [-0.1] * len(tokens)) if tokens else tuple(map(list, LARGE))
        outer = self

        class Handler(StandInHandler):
            model = "large"

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                outer.arrived.append(time.monotonic())
                body = self.read_body()
                outer.bodies.append(body)
                time.sleep(delay)
                chat = self.path.endswith("/chat/completions")
                usage = {"prompt_tokens": 4, "completion_tokens": len(toks)}
                usage["total_tokens"] = 4 + len(toks)
                if body.get("stream"):
                    return self.stream(body, chat, usage)
                time.sleep(pause * len(toks))  # the same generation time as a stream
                c = _choice(chat, toks, lps, "stop")
                self.json({"id": "l", "model": "large", "choices": [c], "usage": usage})
                outer.finished.append(time.monotonic())

            def stream(self, body: dict, chat: bool, usage: dict) -> None:
                if fail == "status":
                    raw = b'{"error": {"message": "out of memory", "type": "server_error"}}'
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                if fail == "event":
                    self.event({"error": {"message": "out of memory", "type": "server_error"}})
                    return
                base = {"id": "l", "model": "large", "created": 1}
                base["object"] = "chat.completion.chunk" if chat else "text_completion"
                if chat:
                    role = {"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}
                    self.event({**base, "choices": [role]})
                for tok, lp in zip(toks, lps, strict=True):
                    self.event({**base, "choices": [_delta(chat, [tok], [lp], None)]})
                    if fail == "mid":
                        return  # the connection closes: no finish_reason, no [DONE]
                    time.sleep(pause)
                self.event({**base, "choices": [_delta(chat, [], [], "stop")]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    self.event({**base, "choices": [], "usage": usage})
                self.event("[DONE]")
                outer.finished.append(time.monotonic())

        super().__init__(Handler)


def cascade_app(
    small: SmallUpstream,
    large: LargeUpstream,
    threshold: float = 3.0,
    *,
    server: str = "vllm",
    **settings: Any,
) -> FastAPI:
    """The proxy app in front of ``small`` (recognised as ``server``), escalating to ``large``."""
    policy = AbstentionPolicy(mode="escalate", threshold=threshold)
    return build_proxy_app(
        small.url,
        ServeSettings(policy=policy, **settings),
        server=server,
        escalate_to=large.url,
        escalate_model="large",
    )


def cascade(
    small: SmallUpstream,
    large: LargeUpstream,
    threshold: float = 3.0,
    *,
    server: str = "vllm",
    **settings: Any,
) -> ServerThread:
    """:func:`cascade_app` served on a free port."""
    return ServerThread(cascade_app(small, large, threshold, server=server, **settings))
