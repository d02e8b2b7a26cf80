"""`gnll serve --upstream` changes a request only as G-NLL needs (docs/serving.md, "What the proxy
changes in a request"): no token cap of its own, alternatives only from the upstream that needs
them, the upstream's ``/tokenize`` and ``/detokenize`` forwarded.

The upstream is a stand-in that records each request's body and answers as the server its
``owned_by`` names would (``vllm``, ``me`` for llama-cpp-python, ``gnll``); the real llama.cpp server
runs the same paths in ``test_serve_proxy_llamacpp.py``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from serve_helpers import ScriptedModel, access_log, chat_entries, chat_pieces, chat_whole

from gnll.serving import ServeSettings, build_inprocess_app, build_proxy_app
from gnll.serving.server import ServerThread

TOKENS = [("Par", -0.5), ("is", -0.25)]


def recording_upstream(
    owner: str, seen: list[dict[str, Any]], max_model_len: int = 2048
) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        card = {"id": "small", "object": "model", "owned_by": owner, "max_model_len": max_model_len}
        return {"object": "list", "data": [card]}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await request.json()
        seen.append({"path": "/tokenize", **body})
        return {"tokens": [1, 2, 3], "count": 3, "max_model_len": max_model_len}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        body = await request.json()
        seen.append({"path": "/detokenize", **body})
        return {"prompt": "decoded"}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        seen.append({"path": "/v1/chat/completions", **body})
        content = chat_entries(TOKENS)
        base = {"id": "chatcmpl-1", "created": 1, "model": "small"}
        if not body.get("stream"):
            usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
            return JSONResponse(chat_whole(base, content, "Paris", usage))

        async def events():
            for event in chat_pieces({**base, "object": "chat.completion.chunk"}, content):
                yield event
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        seen.append({"path": "/v1/completions", **body})
        lp = {
            "tokens": [t for t, _ in TOKENS],
            "token_logprobs": [v for _, v in TOKENS],
            "top_logprobs": None,
            "text_offset": [0, 3],
        }
        choice = {"index": 0, "text": "Paris", "logprobs": lp, "finish_reason": "stop"}
        return {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": "small",
            "choices": [choice],
        }

    return app


def started(owner: str, **settings: Any):
    seen: list[dict[str, Any]] = []
    up = ServerThread(recording_upstream(owner, seen))
    up.__enter__()
    px = ServerThread(build_proxy_app(up.url + "/v1", ServeSettings(**settings)))
    px.__enter__()
    return up, px, seen


@pytest.fixture
def stack(request):
    owner, settings = request.param if isinstance(request.param, tuple) else (request.param, {})
    up, px, seen = started(owner, **settings)
    try:
        yield px, seen
    finally:
        px.__exit__(None, None, None)
        up.__exit__(None, None, None)


def chat(px, **kw) -> httpx.Response:
    body = {"model": "small", "messages": [{"role": "user", "content": "Capital of France?"}], **kw}
    return httpx.post(px.url + "/v1/chat/completions", json=body, timeout=30)


def last(seen: list[dict[str, Any]], path: str) -> dict[str, Any]:
    return [s for s in seen if s["path"] == path][-1]


# ---------------------------------------------------------------- 1. no token cap of its own
@pytest.mark.parametrize("stack", ["vllm"], indirect=True)
def test_proxy_sends_an_unset_max_tokens_unset_and_takes_the_upstreams_limit(stack):
    px, seen = stack
    r = chat(px)
    assert r.status_code == 200, r.text
    sent = last(seen, "/v1/chat/completions")
    assert "max_tokens" not in sent and "max_completion_tokens" not in sent
    assert "x-gnll-default-max-tokens" not in r.headers  # gnll bounded nothing
    # Above in-process gnll's 512: the upstream's limit (2048 here) is the one that applies.
    r = chat(px, max_tokens=2000)
    assert r.status_code == 200, r.text
    assert last(seen, "/v1/chat/completions")["max_tokens"] == 2000
    r = httpx.post(px.url + "/v1/completions", json={"model": "small", "prompt": "Q"}, timeout=30)
    assert r.status_code == 200 and "max_tokens" not in last(seen, "/v1/completions")
    # /health says which limit applies: the upstream's context length, as /v1/models lists it.
    assert httpx.get(px.url + "/health", timeout=30).json()["max_model_len"] == 2048


@pytest.mark.parametrize(
    "stack", [("vllm", {"default_max_tokens": 40, "max_tokens_limit": 64})], indirect=True
)
def test_proxy_bounds_only_when_told_and_then_says_so(stack):
    px, seen = stack
    r = chat(px)
    assert r.status_code == 200
    assert last(seen, "/v1/chat/completions")["max_tokens"] == 40
    assert r.headers["x-gnll-default-max-tokens"] == "40"
    r = chat(px, max_tokens=100)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert "limit of 64" in message and "--max_tokens_limit" in message


def test_inprocess_default_is_said_and_the_limit_error_names_its_option():
    with ServerThread(build_inprocess_app(ScriptedModel(), ServeSettings(), max_wait_ms=1)) as srv:
        body = {"model": "scripted", "messages": [{"role": "user", "content": "unsure"}]}
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200 and r.headers["x-gnll-default-max-tokens"] == "100"
        r = httpx.post(
            srv.url + "/v1/chat/completions", json={**body, "max_tokens": 20}, timeout=30
        )
        assert "x-gnll-default-max-tokens" not in r.headers
        r = httpx.post(
            srv.url + "/v1/chat/completions", json={**body, "max_tokens": 2000}, timeout=30
        )
        assert r.status_code == 400
        assert "gnll serve --max_tokens_limit raises it" in r.json()["error"]["message"]


# ---------------------------------------------------------------- 2. alternatives only where needed
@pytest.mark.parametrize("stack", ["vllm", "gnll", "me"], indirect=True)
def test_proxy_asks_for_alternatives_only_where_the_upstream_needs_them(stack):
    px, seen = stack
    for stream in (False, True):
        r = chat(px, stream=stream)
        assert r.status_code == 200, r.text
        sent = last(seen, "/v1/chat/completions")
        assert sent["logprobs"] is True
        needs = sent.get("top_logprobs")
        r = httpx.post(
            px.url + "/v1/completions", json={"model": "small", "prompt": "Q"}, timeout=30
        )
        completions = last(seen, "/v1/completions")["logprobs"]
        health = httpx.get(px.url + "/health", timeout=30).json()
        if health["server"] == "llama-cpp-python":
            assert needs == 1 and completions == 1
        else:
            assert needs is None and completions == 0, sent
    # What the client asks for still goes up.
    chat(px, logprobs=True, top_logprobs=3)
    assert last(seen, "/v1/chat/completions")["top_logprobs"] == 3


# ---------------------------------------------------------------- 3. /tokenize and /detokenize
@pytest.mark.parametrize("stack", [("vllm", {"api_key": "k"})], indirect=True)
def test_proxy_forwards_tokenize_and_detokenize_to_the_upstream_root(stack):
    px, seen = stack
    auth = {"Authorization": "Bearer k"}
    body = {"model": "small", "messages": [{"role": "user", "content": "Hi"}]}
    assert httpx.post(px.url + "/tokenize", json=body, timeout=30).status_code == 401
    r = httpx.post(px.url + "/tokenize", json=body, headers=auth, timeout=30)
    assert r.status_code == 200 and r.json()["tokens"] == [1, 2, 3]
    assert last(seen, "/tokenize")["messages"] == body["messages"]
    r = httpx.post(
        px.url + "/detokenize", json={"model": "small", "tokens": [1]}, headers=auth, timeout=30
    )
    assert r.json() == {"prompt": "decoded"} and last(seen, "/detokenize")["tokens"] == [1]
    # Token-id prompts (what gnll's vLLM client sends after /tokenize) go up as they are.
    r = httpx.post(
        px.url + "/v1/completions",
        json={"model": "small", "prompt": [1, 2, 3], "max_tokens": 2},
        headers=auth,
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert last(seen, "/v1/completions")["prompt"] == [1, 2, 3]
    assert r.json()["choices"][0]["uncertainty"]["g_nll"] == pytest.approx(0.75)


def test_inprocess_refuses_token_id_prompts_in_one_line():
    with ServerThread(build_inprocess_app(ScriptedModel(), ServeSettings(), max_wait_ms=1)) as srv:
        r = httpx.post(
            srv.url + "/v1/completions", json={"model": "scripted", "prompt": [1, 2]}, timeout=30
        )
        assert r.status_code == 400 and "token ids are not served in-process" in r.text


def test_client_backend_through_the_proxy_uses_the_forwarded_tokenize(caplog):
    """gnll's own vLLM client (what `gnll doctor` and backend=openai use) works through the proxy:
    it takes the proxy for vLLM (its /v1/models is vLLM's) and renders chat prompts via /tokenize."""
    from gnll import GenerationConfig, load_model

    up, px, seen = started("vllm")
    try:
        model = load_model(
            "small", backend="openai", base_url=px.url + "/v1", chat=True, max_retries=0
        )
        gen = model.generate(["Capital of France?"], GenerationConfig.greedy(max_new_tokens=2))
        assert gen[0][0].text == "Paris"
        assert last(seen, "/tokenize")["messages"][0]["content"] == "Capital of France?"
        assert last(seen, "/v1/completions")["prompt"] == [1, 2, 3]
    finally:
        px.__exit__(None, None, None)
        up.__exit__(None, None, None)


def access_entries(caplog) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "gnll.serve.access"]


def test_access_log_has_no_answered_by_without_escalation(caplog):
    up, px, _ = started("vllm")
    try:
        with access_log(caplog):
            chat(px)
        entry = [e for e in access_entries(caplog) if e["path"] == "/v1/chat/completions"][-1]
        assert "answered_by" not in entry and entry["g_nll"] == [0.75]
    finally:
        px.__exit__(None, None, None)
        up.__exit__(None, None, None)


# ---------------------------------------------------------------- a silent or a dead upstream
def stalling_upstream() -> FastAPI:
    """Sends the first chunk of a stream, then nothing with the connection open (vLLM's engine
    dead behind a live HTTP server)."""
    import asyncio

    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "small", "owned_by": "vllm"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        async def events():
            first = {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "finish_reason": None,
            }
            yield f"data: {json.dumps({'id': 'c', 'object': 'chat.completion.chunk', 'choices': [first]})}\n\n"
            await asyncio.sleep(20)

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def test_a_silent_upstream_stream_ends_in_an_error_naming_it():
    with ServerThread(stalling_upstream()) as up:
        settings = ServeSettings(upstream_idle_timeout=0.5)
        with ServerThread(build_proxy_app(up.url + "/v1", settings)) as px:
            r = chat(px, stream=True)
    events = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
    error = events[-1]["error"]
    assert up.url in error["message"] and "--upstream_idle_timeout" in error["message"]
    assert "data: [DONE]" not in r.text


def test_a_dead_upstream_is_said_at_start():
    import logging

    said: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = said.append  # type: ignore[method-assign]
    logger = logging.getLogger("gnll.serve")
    logger.addHandler(handler)
    try:
        with ServerThread(build_proxy_app("http://127.0.0.1:9/v1", ServeSettings())):
            pass
    finally:
        logger.removeHandler(handler)
    messages = [r.getMessage() for r in said]
    assert any("http://127.0.0.1:9/v1 is not reachable yet" in m for m in messages), messages


# ---------------------------------------------------------------- gnll doctor's messages
def test_doctor_without_v1_says_to_add_it_and_every_fix_cell_is_filled():
    from typer.testing import CliRunner

    from gnll.cli.main import app as cli

    up, px, _ = started("vllm")
    try:
        root = up.url  # the server's root, without its /v1
        res = CliRunner().invoke(cli, ["doctor", "--base_url", root], env={"COLUMNS": "300"})
        assert res.exit_code == 1
        assert f"try --base_url {root}/v1" in " ".join(res.output.split())
        res = CliRunner().invoke(
            cli, ["doctor", "--base_url", root, "--model", "small"], env={"COLUMNS": "300"}
        )
        assert f"try --base_url {root}/v1" in " ".join(res.output.split())
        # Against the stand-in (it answers every probe alike): each row's fix is filled in.
        res = CliRunner().invoke(
            cli, ["doctor", "--base_url", root + "/v1", "--requests", "1"], env={"COLUMNS": "300"}
        )
        rows = [ln for ln in res.output.splitlines() if ln.startswith("│") and "│" in ln[1:]]
        cells = [[c.strip() for c in ln.strip("│").split("│")] for ln in rows]
        named = [c for c in cells if c[0]]  # a row's first line names its check
        assert named and all(c[3] for c in named), res.output
    finally:
        px.__exit__(None, None, None)
        up.__exit__(None, None, None)


def test_access_log_of_an_escalated_request_names_who_answered(caplog):
    """The entry's ``model`` is the local one; ``answered_by`` says the larger model answered."""
    from gnll.serving import AbstentionPolicy

    bigger = ScriptedModel()
    bigger.name = "large"
    large = ServerThread(build_inprocess_app(bigger, ServeSettings(), max_wait_ms=1))
    with large:
        settings = ServeSettings(policy=AbstentionPolicy(mode="escalate", threshold=1.0))
        app = build_inprocess_app(
            ScriptedModel(), settings, max_wait_ms=1, escalate_to=large.url + "/v1"
        )
        with ServerThread(app) as srv, access_log(caplog):
            for prompt in ("unsure", "capital?"):
                body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 8}
                r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=30)
                assert r.status_code == 200, r.text
    entries = [e for e in access_entries(caplog) if e["path"] == "/v1/chat/completions"]
    escalated, kept = entries[-2], entries[-1]
    assert escalated["model"] == "scripted"  # the local model, as before
    assert escalated["answered_by"] == ["large"] and escalated["escalated"] == [True]
    assert kept["answered_by"] == ["scripted"] and kept["escalated"] == [False]
