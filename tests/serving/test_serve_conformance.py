"""`gnll serve` speaks the OpenAI API as the official `openai` package types it.

Every response body and every stream chunk is validated with the package's own pydantic types
(``Completion``, ``ChatCompletion``, ``ChatCompletionChunk``), and the SDK's canonical loops
(``for chunk in stream: chunk.choices[0]...``) run, for completions, chat and both streams, in
both modes: in-process (a stand-in model with a decoding loop, so streams go out live, and one
without, so streams are replays) and proxy (in front of the in-process server).
"""

from __future__ import annotations

import contextlib
import json
import time

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from serve_helpers import (
    UNSURE,
    NoLoopModel,
    ScriptedModel,
    StreamedCompletion,
    StreamingModel,
    access_log,
    sse,
)

from gnll.serving import AbstentionPolicy, ServeSettings, build_inprocess_app, create_app
from gnll.serving.proxy import ProxyService
from gnll.serving.server import ServerThread

MODES = ("live", "replay", "proxy")
USER = [{"role": "user", "content": "unsure"}]


def check_body(body: dict, chat: bool) -> None:
    (ChatCompletion if chat else Completion).model_validate(body)
    for c in body["choices"]:
        assert c["finish_reason"] in ("stop", "length")


def check_stream(events: list, chat: bool, *, usage: bool, counted: bool = True) -> list[dict]:
    """Validate every chunk; the ``choices: []`` usage chunk is last, and only when asked for
    (``counted``: with the counts; else ``usage: null``, nobody counted the answer)."""
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    for chunk in chunks:
        assert "error" not in chunk, chunk
        if chat:
            ChatCompletionChunk.model_validate(chunk)
        else:
            StreamedCompletion.model_validate(chunk)
            if chunk["choices"] and chunk["choices"][0]["finish_reason"] is not None:
                Completion.model_validate(chunk)
    finishing = [c["index"] for ch in chunks for c in ch["choices"] if c["finish_reason"]]
    assert sorted(finishing) == sorted(set(finishing)), finishing  # each choice finishes once
    empty = [i for i, c in enumerate(chunks) if not c["choices"]]
    if usage:
        assert empty == [len(chunks) - 1]
        if counted:
            assert chunks[-1]["usage"]["completion_tokens"] > 0
        else:
            assert chunks[-1]["usage"] is None
    else:
        assert empty == []
    return chunks


@pytest.fixture(scope="module", params=MODES)
def server(request):
    """(mode, server) with the policy off; the upstream of the proxy is the live server."""
    mode = request.param
    model = ScriptedModel() if mode == "replay" else StreamingModel()
    app = build_inprocess_app(model, ServeSettings(), max_wait_ms=1)
    with ServerThread(app) as srv:
        srv.mode, srv.model_id = mode, model.name
        if mode != "proxy":
            yield srv
            return
        service = ProxyService(srv.url + "/v1", timeout=30)
        with ServerThread(create_app(service, ServeSettings())) as px:
            px.mode, px.model_id = mode, model.name
            yield px


def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)


def post(srv, path: str, **body) -> httpx.Response:
    return httpx.post(srv.url + "/v1" + path, json={"model": srv.model_id, **body}, timeout=30)


@pytest.mark.parametrize("chat", [False, True])
def test_responses_validate_with_the_openai_types(server, chat):
    path, kw = ("/chat/completions", {"messages": USER}) if chat else ("/completions", {})
    if not chat:
        kw["prompt"] = "unsure"
    for extra in ({}, {"logprobs": True, "top_logprobs": 2} if chat else {"logprobs": 2}):
        r = post(server, path, **kw, **extra)
        assert r.status_code == 200, r.text
        check_body(r.json(), chat)
        assert r.json()["choices"][0]["uncertainty"]["num_tokens"] == 2


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("usage", [False, True])
def test_streams_validate_and_end_with_usage_only_when_asked(server, chat, usage):
    path, kw = ("/chat/completions", {"messages": USER}) if chat else ("/completions", {})
    if not chat:
        kw["prompt"] = "unsure"
    opts = {"stream_options": {"include_usage": True}} if usage else {}
    r = post(server, path, stream=True, logprobs=True if chat else 1, **kw, **opts)
    assert r.status_code == 200, r.text
    chunks = check_stream(sse(r.text), chat, usage=usage)
    text = "".join(
        (c["choices"][0]["delta"].get("content") or "") if chat else c["choices"][0]["text"]
        for c in chunks
        if c["choices"]
    )
    assert text == "".join(UNSURE[0])
    last = [c for c in chunks if c["choices"] and "uncertainty" in c["choices"][0]]
    assert last[-1]["choices"][0]["uncertainty"]["g_nll"] == pytest.approx(5.0)


def test_the_sdks_canonical_loops_run(server):
    c = client(server)
    pieces = []
    for chunk in c.completions.create(
        model=server.model_id, prompt="unsure", stream=True, max_tokens=10
    ):
        pieces.append(chunk.choices[0].text)
    assert "".join(pieces) == "".join(UNSURE[0])
    pieces = []
    for chunk in c.chat.completions.create(model=server.model_id, messages=USER, stream=True):
        pieces.append(chunk.choices[0].delta.content or "")
    assert "".join(pieces) == "".join(UNSURE[0])
    stream = c.chat.completions.create(
        model=server.model_id,
        messages=USER,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 2


def test_top_logprobs_come_back_as_asked(server):
    c = client(server)
    r = c.chat.completions.create(
        model=server.model_id, messages=USER, logprobs=True, top_logprobs=2
    )
    content = r.choices[0].logprobs.content
    legacy = c.completions.create(model=server.model_id, prompt="unsure", logprobs=2)
    if server.mode == "replay":  # no decoding loop, no alternatives: /health says so
        assert httpx.get(server.url + "/health").json()["top_logprobs"] == 0
        assert [t.top_logprobs for t in content] == [[], []]
        return
    assert [len(t.top_logprobs) for t in content] == [2, 2]
    assert content[0].top_logprobs[0].token == UNSURE[0][0]
    assert content[0].top_logprobs[0].logprob == pytest.approx(UNSURE[1][0])
    assert [len(t) for t in legacy.choices[0].logprobs.top_logprobs] == [2, 2]


def test_unknown_model_is_404_model_not_found(server):
    # In proxy mode the upstream (gnll in-process) says so and the proxy passes it through.
    with pytest.raises(openai.NotFoundError) as err:
        client(server).chat.completions.create(model="gpt-4o", messages=USER)
    assert err.value.code == "model_not_found" and err.value.status_code == 404


#: A tool request every mode refuses: a named function that is not among the tools.
BAD_TOOL_CHOICE = {
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "tool_choice": {"type": "function", "function": {"name": "g"}},
}


def check_envelope(r: httpx.Response, status: int) -> dict:
    """OpenAI's error object; its ``code`` is a string or null (never the HTTP status: a strictly
    typed client's ``Option<String>`` fails on an integer)."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["code"] is None or isinstance(err["code"], str), err
    return err


def test_every_error_has_the_openai_envelope(server):
    for method, path, status in (
        ("GET", "/v1/nowhere", 404),
        ("POST", "/v1/models", 405),
        ("GET", "/nowhere", 404),
        ("GET", "/ui/api/examples?task=nope", 400),
    ):
        check_envelope(httpx.request(method, server.url + path), status)
    check_envelope(post(server, "/chat/completions", messages=USER, **BAD_TOOL_CHOICE), 400)
    check_envelope(post(server, "/completions", prompt="x", max_tokens=-1), 400)
    bad = httpx.post(server.url + "/v1/completions", content=b"{", timeout=30)
    check_envelope(bad, 400)
    missing = post(server, "/completions", prompt="x", model="gpt-4o")
    assert check_envelope(missing, 404)["code"] == "model_not_found"


def test_the_cascade_answers_errors_in_the_same_envelope(policed_server):
    r = post(policed_server, "/chat/completions", messages=USER, **BAD_TOOL_CHOICE)
    check_envelope(r, 400)
    missing = post(policed_server, "/completions", prompt="x", model="gpt-4o")
    assert check_envelope(missing, 404)["code"] == "model_not_found"


@pytest.mark.parametrize(
    "extra",
    [
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
        {"response_format": {"type": "json_object"}},
        {"functions": [{"name": "f"}]},
    ],
)
def test_options_that_change_the_answer_format_are_refused(server, extra):
    """In-process, tools are answered (gnll.serving.tools), JSON needs a model that decodes under
    a grammar (the scripted ones do not) and ``functions`` is refused. The proxy passes tools and
    JSON through (gnll.serving.proxy_tools): its upstream (in-process gnll here) answers the
    tools and refuses the JSON, in its own words, named."""
    r = post(server, "/chat/completions", messages=USER, **extra)
    if "tools" in extra:
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    else:
        assert r.status_code == 400
        assert r.json()["error"]["param"] == next(iter(extra))
        if server.mode == "proxy" and "response_format" in extra:
            message = r.json()["error"]["message"]
            assert message.startswith("the upstream gnll server refused response_format")
    ok = post(server, "/chat/completions", messages=USER, response_format={"type": "text"})
    assert ok.status_code == 200


def test_no_p_correct_header_without_calibration(server):
    r = post(server, "/chat/completions", messages=USER)
    assert "x-uncertainty-p-correct" not in r.headers
    assert "x-uncertainty-abstain" not in r.headers  # no policy: nothing decided
    assert float(r.headers["x-uncertainty-g-nll"]) == pytest.approx(5.0)


def test_streamed_requests_are_logged_with_their_uncertainty(server, caplog):
    with access_log(caplog):
        r = post(server, "/chat/completions", messages=USER, stream=True)
        assert r.status_code == 200
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            lines = [json.loads(x.message) for x in caplog.records if "stream" in x.message]
            if lines:
                break
            time.sleep(0.02)
    entry = lines[-1]
    assert entry["stream"] is True and entry["choices"] == 1 and entry["stream_sent"] is True
    assert entry["g_nll"] == [pytest.approx(5.0)] and entry["num_tokens"] == [2]


@pytest.fixture(scope="module")
def policed():
    """In-process servers (live streams) under flag and refuse, threshold between SURE and UNSURE."""
    out = {}
    threads = []
    for mode in ("flag", "refuse"):
        policy = AbstentionPolicy(mode=mode, threshold=1.0, refusal="I do not know.")
        srv = ServerThread(build_inprocess_app(StreamingModel(), ServeSettings(policy=policy)))
        threads.append(srv.start())
        srv.model_id = "streaming"
        out[mode] = srv
    yield out
    for srv in threads:
        srv.stop()


def test_flag_keeps_the_finish_reason_enum_and_length(policed):
    srv = policed["flag"]
    r = post(srv, "/completions", prompt="unsure", max_tokens=1)
    check_body(r.json(), chat=False)
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "length"  # cut at max_tokens: still said
    assert choice["uncertainty"]["abstain"] is True and r.headers["x-uncertainty-abstain"] == "true"
    events = sse(post(srv, "/chat/completions", messages=USER, stream=True).text)
    finals = [
        c for c in check_stream(events, True, usage=False) if c["choices"][0]["finish_reason"]
    ]
    assert finals[-1]["choices"][0]["finish_reason"] == "stop"
    assert finals[-1]["choices"][0]["uncertainty"]["abstain"] is True


def test_refuse_withholds_the_answer_and_covers_sampling(policed):
    srv = policed["refuse"]
    r = post(srv, "/chat/completions", messages=USER, logprobs=True, top_logprobs=2)
    check_body(r.json(), chat=True)
    assert r.json()["choices"][0]["message"]["content"] == "I do not know."
    assert "Maybe" not in r.text and "Lyon" not in r.text
    events = sse(post(srv, "/chat/completions", messages=USER, stream=True, logprobs=True).text)
    check_stream(events, True, usage=False)
    assert "Lyon" not in json.dumps(events)
    sampled = post(srv, "/chat/completions", messages=USER, temperature=0.7)
    assert sampled.status_code == 400 and sampled.json()["error"]["param"] == "temperature"


def test_proxy_health_reports_the_upstream():
    service = ProxyService("http://127.0.0.1:9/v1", timeout=2)
    with ServerThread(create_app(service, ServeSettings())) as px:
        health = httpx.get(px.url + "/health")
        assert health.status_code == 503
        body = health.json()
        assert body["status"] == "unavailable" and body["upstream"]["reachable"] is False
        assert "cannot reach" in body["upstream"]["error"]
        assert httpx.get(px.url + "/live").json() == {"status": "alive"}


def test_proxy_stream_is_logged_for_its_whole_duration(caplog):
    model = StreamingModel(delay=0.05)  # 3 steps (2 tokens and EOS): >= 0.15 s of decoding
    with ServerThread(build_inprocess_app(model, ServeSettings(), max_wait_ms=1)) as up:
        service = ProxyService(up.url + "/v1", timeout=30)
        with ServerThread(create_app(service, ServeSettings())) as px:
            px.model_id = model.name
            with access_log(caplog):
                started = time.perf_counter()
                r = post(px, "/chat/completions", messages=USER, stream=True)
                took = time.perf_counter() - started
                time.sleep(0.2)
    assert r.status_code == 200 and took >= 0.15
    mine = [
        json.loads(x.message)
        for x in caplog.records
        if x.name == "gnll.serve.access" and '"stream": true' in x.message
    ]
    proxy_entry = mine[-1]  # the proxy's line is written after the upstream's
    assert proxy_entry["seconds"] >= 0.15
    assert proxy_entry["g_nll"] == [pytest.approx(5.0)]


def test_gnll_doctor_recognises_and_passes_gnll_serve():
    from gnll.backends.openai.doctor import diagnose
    from gnll.backends.openai.model import OpenAICompatModel

    app = build_inprocess_app(StreamingModel(delay=0.0), ServeSettings(), max_wait_ms=1)
    with ServerThread(app) as srv:
        model = OpenAICompatModel("streaming", base_url=srv.url + "/v1")
        checks = {c.name: c for c in diagnose(model, requests=2, concurrency=1)}
    assert model.profile.name == "gnll"
    assert not [c for c in checks.values() if c.verdict == "fail"]
    for name in ("greedy decoding", "log-probs raw", "deterministic", "server defaults"):
        assert checks[name].verdict == "pass", checks[name]
    # The one warning left is a real limit: answers' log-probs exclude the end-of-sequence token.
    assert [c.name for c in checks.values() if c.verdict == "warn"] == ["terminator reported"]


@pytest.mark.server
def test_a_busy_port_fails_before_the_banner():
    import socket
    import subprocess
    import sys

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        cmd = [sys.executable, "-c", "from gnll.cli.main import app; app()", "serve"]
        args = ["--upstream", "http://127.0.0.1:9/v1", "--port", str(port)]
        done = subprocess.run(cmd + args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "on http://" not in done.stderr  # no "serving on" banner for a server that never was


# ---------------------------------------------------------------- every policy, every path
POLICIES = ("annotate", "flag", "refuse", "escalate")
BIG = (["Lyon", "."], [-0.5, -0.25])  # the escalation target's answer


class BigModel(NoLoopModel):
    """The larger model an uncertain answer escalates to (answers differently, so it shows)."""

    name = "big"

    def generate(self, prompts, config=None, **kwargs):
        from gnll.backends.base import Generation

        return [[Generation("Lyon.", [7, 8], *map(list, BIG), "eos")] for _ in prompts]


@pytest.fixture(
    scope="module",
    params=[(m, p) for m in MODES for p in POLICIES] + [("proxy", "proxy-escalates")],
    ids=str,
)
def policed_server(request):
    """(mode, policy) -> a server that abstains above G-NLL 1 (the scripted "unsure" answer has
    5.0, every other prompt 0.03). In proxy mode the proxy applies flag/refuse itself; under
    escalate it stands in front of an escalating in-process server, and under proxy-escalates it
    escalates itself: the in-process server (no policy) answers first, cut at the early decision,
    and the larger model's server answers instead."""
    mode, policy = request.param
    if policy == "proxy-escalates":
        yield from _proxy_escalating()
        return
    policy_of = AbstentionPolicy(mode=policy, threshold=1.0, refusal="I do not know.")
    with contextlib.ExitStack() as stack:
        escalate_to = None
        if policy == "escalate":
            big = build_inprocess_app(BigModel(), ServeSettings(), max_wait_ms=1)
            escalate_to = stack.enter_context(ServerThread(big)).url + "/v1"
        local_policy = policy_of if mode != "proxy" or policy == "escalate" else AbstentionPolicy()
        model = NoLoopModel() if mode == "replay" else StreamingModel()
        app = build_inprocess_app(
            model,
            ServeSettings(policy=local_policy),
            max_wait_ms=1,
            escalate_to=escalate_to,
            escalate_model="big",
        )
        srv = stack.enter_context(ServerThread(app))
        if mode == "proxy":
            proxy_policy = AbstentionPolicy() if policy == "escalate" else policy_of
            service = ProxyService(srv.url + "/v1", timeout=30)
            srv = stack.enter_context(
                ServerThread(create_app(service, ServeSettings(policy=proxy_policy)))
            )
        srv.mode, srv.policy, srv.model_id = mode, policy, model.name
        # a proxy in front of an escalating server passes on its answers, but not its record
        srv.escalates = policy == "escalate" and mode != "proxy"
        yield srv


def _proxy_escalating():
    from gnll.serving import build_proxy_app

    policy = AbstentionPolicy(mode="escalate", threshold=1.0)
    with contextlib.ExitStack() as stack:
        big = build_inprocess_app(BigModel(), ServeSettings(), max_wait_ms=1)
        big_url = stack.enter_context(ServerThread(big)).url + "/v1"
        model = StreamingModel()
        small = build_inprocess_app(model, ServeSettings(), max_wait_ms=1)
        small_url = stack.enter_context(ServerThread(small)).url + "/v1"
        app = build_proxy_app(
            small_url, ServeSettings(policy=policy), escalate_to=big_url, escalate_model="big"
        )
        srv = stack.enter_context(ServerThread(app))
        srv.mode, srv.policy, srv.model_id = "proxy", "escalate", model.name
        srv.escalates = True
        yield srv


def _request(chat: bool, prompt: str) -> tuple[str, dict]:
    if chat:
        return "/chat/completions", {"messages": [{"role": "user", "content": prompt}]}
    return "/completions", {"prompt": prompt}


@pytest.mark.parametrize("prompt", ["unsure", "sure"])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_every_policy_answers_as_openai_does(policed_server, chat, prompt):
    """Bodies and every stream chunk validate with the openai types; each choice finishes once;
    the usage chunk comes only when asked for, with the same usage as the body (prompt tokens
    counted: one per character of the scripted tokenizer)."""
    srv = policed_server
    path, kw = _request(chat, prompt)
    body = post(srv, path, **kw)
    assert body.status_code == 200, body.text
    check_body(body.json(), chat)
    usage = body.json()["usage"]
    u = body.json()["choices"][0]["uncertainty"]
    early = u.get("early")
    if srv.escalates:  # the larger model answers the uncertain question only
        assert u["escalated"] is (prompt == "unsure") and u["answered_by"]
        if u["escalated"] and srv.mode == "proxy":  # the small server's stream cut there
            assert u["local"]["early"] is True
    if early and srv.mode == "proxy":
        # The proxy closed the upstream's stream at the decision: nobody counted the answer.
        assert usage is None
    else:
        assert usage["prompt_tokens"] > 0, usage
    if not chat and usage is not None:
        assert usage["prompt_tokens"] == len(prompt)
    for include_usage in (False, True):
        opts = {"stream_options": {"include_usage": True}} if include_usage else {}
        r = post(srv, path, stream=True, **kw, **opts)
        assert r.status_code == 200, r.text
        chunks = check_stream(sse(r.text), chat, usage=include_usage, counted=usage is not None)
        if include_usage:
            assert chunks[-1]["usage"] == usage
        text = "".join(
            (c["choices"][0]["delta"].get("content") or "") if chat else c["choices"][0]["text"]
            for c in chunks
            if c["choices"]
        )
        content = body.json()["choices"][0]
        assert text == (content["message"]["content"] if chat else content["text"])
        final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert final[-1]["choices"][0]["uncertainty"]["g_nll"] is not None


def test_every_policy_passes_the_sdks_canonical_loops(policed_server):
    """``for chunk in stream: chunk.choices[0]`` (the openai SDK's README loop), sync and async."""
    import asyncio

    srv = policed_server
    c = client(srv)
    for prompt in ("unsure", "sure"):
        messages = [{"role": "user", "content": prompt}]
        pieces = [
            chunk.choices[0].delta.content or ""
            for chunk in c.chat.completions.create(
                model=srv.model_id, messages=messages, stream=True
            )
        ]
        assert "".join(pieces)
        pieces = [
            chunk.choices[0].text
            for chunk in c.completions.create(model=srv.model_id, prompt=prompt, stream=True)
        ]
        assert "".join(pieces)
    expected = {"annotate": "Maybe Lyon", "flag": "Maybe Lyon", "refuse": "I do not know."}

    async def main() -> str:
        ac = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)
        stream = await ac.chat.completions.create(model=srv.model_id, messages=USER, stream=True)
        return "".join([chunk.choices[0].delta.content or "" async for chunk in stream])

    assert asyncio.run(main()) == expected.get(srv.policy, "Lyon.")
