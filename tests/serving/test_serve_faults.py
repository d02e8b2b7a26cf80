"""`gnll serve` under faults: an upstream that dies mid-stream or restarts, clients that go away,
oversized, slow and malformed requests, fuzzed request bodies, and kill -9 of the server itself.

Stand-in models (``serve_helpers``) and loopback servers only; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from serve_helpers import LONG, SURE, StreamedCompletion, StreamingModel, access_log, sse
from starlette.testclient import TestClient

from gnll.serving import ServeSettings, build_inprocess_app, create_app
from gnll.serving.proxy import ProxyService
from gnll.serving.server import ServerThread, free_port

USER = [{"role": "user", "content": "sure"}]


def envelope(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


class DyingUpstream:
    """An OpenAI-ish upstream on a raw socket: answers /v1/models, and streams two chunks of a chat
    answer, then closes the connection as a killed process would (no end of stream)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                request = conn.recv(65536).decode(errors="replace")
                if request.startswith("GET /v1/models"):
                    body = json.dumps({"object": "list", "data": [{"id": "dying"}]}).encode()
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
                        + body
                    )
                    continue
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
                for piece in ("Par", "is"):
                    lp = {"content": [{"token": piece, "logprob": -0.1, "top_logprobs": []}]}
                    chunk = {
                        "id": "x",
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": "dying",
                        "choices": [{"index": 0, "delta": {"content": piece}, "logprobs": lp}],
                    }
                    conn.sendall(f"data: {json.dumps(chunk)}\n\n".encode())
                    time.sleep(0.05)
                conn.shutdown(socket.SHUT_RDWR)  # killed mid-stream

    def close(self) -> None:
        self.sock.close()


def test_upstream_killed_mid_stream_gives_an_error_event_and_the_proxy_lives_on():
    upstream = DyingUpstream()
    try:
        service = ProxyService(f"http://127.0.0.1:{upstream.port}/v1", timeout=5, server="generic")
        with ServerThread(create_app(service, ServeSettings())) as px:
            for _ in range(2):  # the proxy keeps serving after the first broken stream
                r = httpx.post(
                    px.url + "/v1/chat/completions",
                    json={"messages": USER, "stream": True},
                    timeout=10,
                )
                events = sse(r.text)
                assert events[-1] != "[DONE]"  # the stream ends without pretending to be whole
                for chunk in events[:-1]:
                    ChatCompletionChunk.model_validate(chunk)
                assert set(events[-1]["error"]) == {"message", "type", "param", "code"}
                assert "upstream" in events[-1]["error"]["message"]
    finally:
        upstream.close()


def test_upstream_down_then_restarted_traffic_resumes_without_restarting_gnll():
    port = free_port()
    model = StreamingModel()

    def upstream() -> ServerThread:
        return ServerThread(build_inprocess_app(model, ServeSettings(), max_wait_ms=1), port=port)

    service = ProxyService(f"http://127.0.0.1:{port}/v1", timeout=5)
    with ServerThread(create_app(service, ServeSettings())) as px:
        body = {"messages": USER}
        with upstream():
            assert httpx.get(px.url + "/health").status_code == 200
            ok = httpx.post(px.url + "/v1/chat/completions", json=body, timeout=10)
            assert ok.json()["choices"][0]["message"]["content"] == "".join(SURE[0])
        # The upstream is gone: readiness says so, requests get a 502 with the reason.
        health = httpx.get(px.url + "/health")
        assert health.status_code == 503 and health.json()["upstream"]["reachable"] is False
        envelope(httpx.post(px.url + "/v1/chat/completions", json=body, timeout=10), 502)
        with upstream():
            assert httpx.get(px.url + "/health").status_code == 200
            again = httpx.post(px.url + "/v1/chat/completions", json=body, timeout=10)
            assert again.status_code == 200
            ChatCompletion.model_validate(again.json())


def test_a_client_that_leaves_mid_stream_frees_its_decoding_slot(caplog):
    # One decoding row (max_batch_prompts=1): a request can only start when the row is free.
    model = StreamingModel(delay=0.02)  # the abandoned answer would need 200 steps, >= 4 s
    app = build_inprocess_app(model, ServeSettings(max_tokens_limit=512), max_batch_prompts=1)
    with ServerThread(app) as srv, access_log(caplog):
        body = {"prompt": "long", "stream": True, "max_tokens": 300}
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=10) as r:
            got = 0
            for line in r.iter_lines():
                got += line.startswith("data:")
                if got == 3:
                    break  # the client goes away after three chunks
        started = time.perf_counter()
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "sure"}, timeout=10)
        took = time.perf_counter() - started
        assert r.status_code == 200
        deadline = time.monotonic() + 5
        while not model.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(model.cancelled) == 1  # the abandoned request's rows left the decoding loop
    decoded = sum(1 for step in model.steps if model.cancelled[0] in step)
    assert decoded < len(LONG[0]) / 2  # it stopped long before its answer was done
    assert took < 2.0, f"the next request waited {took:.2f} s for the abandoned one"
    entries = [json.loads(r.message) for r in caplog.records if r.name == "gnll.serve.access"]
    assert [e["stream_sent"] for e in entries if e.get("stream")] == [False]  # logged as such


def test_oversized_bodies_are_413_and_slow_senders_408():
    app = build_inprocess_app(
        StreamingModel(), ServeSettings(max_request_bytes=2048, body_timeout=1)
    )
    with ServerThread(app) as srv:
        big = {"prompt": "x" * 5000}
        envelope(httpx.post(srv.url + "/v1/completions", json=big), 413)
        # A body announced but never sent in full: cut off after body_timeout.
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b'content-length: 100\r\n\r\n{"prompt": '
            )
            started = time.perf_counter()
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
                if b"}}" in reply:
                    break
            took = time.perf_counter() - started
            reply = reply.decode()
        assert reply.startswith("HTTP/1.1 408") and '"error"' in reply
        assert took < 5


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"prompt": "\xff\xfe"}', b"[1, 2]", b"", b'"text"'],
    ids=["malformed", "invalid-utf8", "array", "empty", "string"],
)
def test_malformed_bodies_are_400_with_the_envelope(content):
    with TestClient(build_inprocess_app(StreamingModel())) as tc:
        r = tc.post(
            "/v1/completions", content=content, headers={"content-type": "application/json"}
        )
        envelope(r, 400)


# ---------------------------------------------------------------------------------- fuzzing
_any = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(), st.text(max_size=8))
_messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "developer"])},
        optional={"content": st.text(max_size=20)},
    ),
    min_size=1,
    max_size=3,
)
#: Values that are in range; :func:`_body` breaks one field of some bodies.
_common = {
    "model": st.just("streaming"),
    "max_tokens": st.integers(1, 64),
    "temperature": st.one_of(st.just(0.0), st.floats(0, 2)),
    "top_p": st.just(1.0),
    "n": st.just(1),
    "stop": st.lists(st.text(min_size=1, max_size=3), max_size=4),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "seed": st.integers(0, 2**31),
    "logit_bias": st.just({}),
    "tools": st.just([]),
    "response_format": st.just({"type": "text"}),
    "user": st.text(max_size=5),
}
_bad = st.one_of(
    _any,
    st.sampled_from(
        [-1, 0, 10**9, 2.5, float("nan"), float("inf"), "gpt-4o", [], {}, [{"type": "function"}],
         {"type": "json_object"}, {"x": 1}]
    ),
)  # fmt: skip


def _body(required: dict, optional: dict):
    """Mostly well-typed bodies (so that many are answered), some with one field of any type."""
    valid = st.fixed_dictionaries(required, optional=optional)
    broken = st.tuples(valid, st.sampled_from([*required, *optional]), _bad).map(
        lambda t: {**t[0], t[1]: t[2]}
    )
    return st.one_of(valid, valid, broken)


_completion = _body(
    {"prompt": st.one_of(st.text(max_size=30), st.lists(st.text(max_size=10), max_size=3))},
    {**_common, "logprobs": st.integers(0, 5), "echo": st.just(False)},
)
_chat = _body(
    {"messages": _messages},
    {
        **_common,
        "logprobs": st.booleans(),
        "top_logprobs": st.integers(0, 5),
        "max_completion_tokens": st.integers(1, 64),
    },
)


@pytest.fixture(scope="module")
def fuzz_client():
    app = build_inprocess_app(StreamingModel(delay=0.0), ServeSettings(max_tokens_limit=512))
    with TestClient(app, raise_server_exceptions=False) as tc:
        yield tc


def _post(tc: TestClient, path: str, body: dict):
    # allow_nan: NaN and Infinity go out as the bare words Python's json module reads back.
    content = json.dumps(body, allow_nan=True)
    return tc.post(path, content=content, headers={"content-type": "application/json"})


def _check(r, chat: bool, body: dict) -> None:
    assert r.status_code in (200, 400, 404), (r.status_code, r.text, body)
    if r.status_code != 200:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
        return
    if r.headers["content-type"].startswith("text/event-stream"):
        events = sse(r.text)
        assert events[-1] == "[DONE]", events[-1]
        for chunk in events[:-1]:
            if chat:
                ChatCompletionChunk.model_validate(chunk)
            else:
                StreamedCompletion.model_validate(chunk)
        return
    (ChatCompletion if chat else Completion).model_validate(r.json())


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=_completion)
def test_fuzzed_completions_get_an_openai_answer_or_error(fuzz_client, body):
    _check(_post(fuzz_client, "/v1/completions", body), False, body)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=_chat)
def test_fuzzed_chat_gets_an_openai_answer_or_error(fuzz_client, body):
    _check(_post(fuzz_client, "/v1/chat/completions", body), True, body)


# ---------------------------------------------------------------------------------- kill -9
@pytest.mark.server
def test_kill_9_and_restart_lose_nothing_promised(tmp_path):
    """The server holds no state a client was promised (only metrics counters): after kill -9 and
    a restart on the same port the same request gets the same answer."""
    model = StreamingModel()
    with ServerThread(build_inprocess_app(model, ServeSettings(), max_wait_ms=1)) as up:
        port = free_port()
        cmd = [
            sys.executable, "-c", "from gnll.cli.main import app; app()",
            "serve", "--upstream", up.url + "/v1",
            "--port", str(port),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        url = f"http://127.0.0.1:{port}"
        answers = []
        for _ in range(2):
            proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
            try:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        if httpx.get(url + "/health", timeout=2).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    assert proc.poll() is None, proc.stderr.read().decode()
                    assert time.monotonic() < deadline, "gnll serve did not come up in 60 s"
                    time.sleep(0.1)
                r = httpx.post(url + "/v1/chat/completions", json={"messages": USER}, timeout=10)
                answers.append(r.json()["choices"][0])
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
                proc.stderr.close()
    assert answers[0]["message"] == answers[1]["message"]
    assert answers[0]["uncertainty"] == answers[1]["uncertainty"]
