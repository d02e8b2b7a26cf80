"""`gnll serve --upstream` where the upstream silently ignores part of a request.

The upstream here is a stand-in that behaves as llama-cpp-python does (recognised by its
``owned_by: me``), or as an unknown server: it answers any model name, one choice whatever ``n``
asks, never sends a usage chunk in a stream, and (for the question "cut") ends a stream without a
``finish_reason``, as llama-cpp-python does to a running stream when another request arrives. The
proxy must answer as OpenAI would, and say what happened. The real llama.cpp server runs the same
paths in ``test_serve_proxy_llamacpp.py``.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from serve_helpers import access_log, chat_entries, chat_pieces, chat_whole, sse

from gnll.serving import AbstentionPolicy, ServeSettings, create_app
from gnll.serving.proxy import ProxyService
from gnll.serving.server import ServerThread

TOKENS = [("Par", -0.5), ("is", -0.25)]
PROMPT_TOKENS = 7


def fake_upstream(owner: str, *, interrupt: bool = False) -> FastAPI:
    """``interrupt``: a stream is cut (no content, no finish_reason) when another request arrives
    while it runs, as llama-cpp-python's default ``--interrupt_requests true`` does."""
    app = FastAPI()
    arrivals = [0]

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "small", "object": "model", "owned_by": owner}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        cut = body["messages"][-1]["content"] == "cut"
        arrivals[0] += 1
        mine = arrivals[0]
        content = chat_entries(TOKENS)
        base = {"id": "chatcmpl-1", "created": 1, "model": body.get("model") or "small"}
        if not body.get("stream"):
            usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 2, "total_tokens": 9}
            return JSONResponse(chat_whole(base, content, "Paris", usage))

        async def events():
            kind = {**base, "object": "chat.completion.chunk"}
            first = {"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}
            yield f"data: {json.dumps({**kind, 'choices': [first]})}\n\n"
            if interrupt:
                await asyncio.sleep(0.3)
            if not cut and not (interrupt and arrivals[0] != mine):
                for event in chat_pieces(kind, content):
                    yield event
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module", params=["me", "someone"], ids=["llama-cpp-python", "generic"])
def proxy(request):
    with ServerThread(fake_upstream(request.param)) as up:
        service = ProxyService(up.url + "/v1", timeout=30)
        with ServerThread(create_app(service, ServeSettings())) as px:
            px.owner = request.param
            px.client = openai.OpenAI(
                base_url=px.url + "/v1", api_key="x", max_retries=0, timeout=30
            )
            yield px


def ask(content: str = "capital?") -> list[dict]:
    return [{"role": "user", "content": content}]


def test_a_model_the_upstream_does_not_list_is_404(proxy):
    for stream in (False, True):
        with pytest.raises(openai.NotFoundError) as err:
            proxy.client.chat.completions.create(model="gpt-4o", messages=ask(), stream=stream)
        assert err.value.code == "model_not_found" and "small" in err.value.message
    ok = proxy.client.chat.completions.create(model="small", messages=ask())
    assert ok.choices[0].message.content == "Paris"


def test_n_answered_with_one_choice_is_400(proxy):
    with pytest.raises(openai.BadRequestError) as err:
        proxy.client.chat.completions.create(model="small", messages=ask(), n=3, temperature=1.0)
    assert err.value.param == "n" and "n=3" in err.value.message


def test_include_usage_gets_a_usage_chunk_with_the_upstreams_counts(proxy):
    chunks = list(
        proxy.client.chat.completions.create(
            model="small", messages=ask(), stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == [] and all(c.choices for c in chunks[:-1])
    # Not known to send one: the stream is a replay of a whole answer, with the upstream's counts.
    assert chunks[-1].usage.prompt_tokens == PROMPT_TOKENS
    assert chunks[-1].usage.completion_tokens == 2
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Paris"


def test_a_stream_cut_without_finish_reason_says_so_and_is_logged(proxy, caplog):
    with access_log(caplog):
        r = httpx.post(
            proxy.url + "/v1/chat/completions",
            json={"model": "small", "messages": ask("cut"), "stream": True},
            timeout=30,
        )
        deadline = time.monotonic() + 5
        entries: list = []
        while time.monotonic() < deadline and not entries:
            entries = [
                json.loads(x.message) for x in caplog.records if '"stream": true' in x.message
            ]
            time.sleep(0.02)
    events = sse(r.text)
    err = events[-1]["error"]
    assert "without a finish_reason" in err["message"] and "empty" not in err["message"]
    if proxy.owner == "me":
        assert "--interrupt_requests false" in err["message"]
    assert entries[-1]["error"] == err["message"]


def test_refuse_and_flag_keep_working_in_front_of_it():
    with ServerThread(fake_upstream("me")) as up:
        policy = AbstentionPolicy(mode="refuse", threshold=0.1, refusal="No.")
        service = ProxyService(up.url + "/v1", timeout=30)
        with ServerThread(create_app(service, ServeSettings(policy=policy))) as px:
            r = httpx.post(
                px.url + "/v1/chat/completions",
                json={"model": "small", "messages": ask(), "stream": True},
                timeout=30,
            )
            assert "Paris" not in r.text and sse(r.text)[-1] == "[DONE]"


def test_doctor_streams_concurrently_and_names_the_interrupt_setting():
    from gnll.backends.openai.doctor import _streams_check
    from gnll.backends.openai.model import OpenAICompatModel

    for interrupt, verdict in ((True, "fail"), (False, "pass")):
        with ServerThread(fake_upstream("me", interrupt=interrupt)) as up:
            model = OpenAICompatModel("small", base_url=up.url + "/v1", endpoint="chat")
            check = _streams_check(model, 4)
        assert model.profile.name == "llama-cpp-python"
        assert check.verdict == verdict, check
        if interrupt:
            assert "3 of 4" in check.detail and "--interrupt_requests false" in check.fix


def _serve_cli(args: list[str]):
    """``gnll serve`` in-process with a busy port: everything up to listening runs (start-up
    checks and warnings), then it stops with exit status 1 before loading a model."""
    import socket

    from typer.testing import CliRunner

    from gnll.cli.main import app

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = str(busy.getsockname()[1])
        return CliRunner().invoke(app, ["serve", "--port", port, *args])


def test_proxy_calibration_auto_says_why_it_cannot_apply():
    res = _serve_cli(["--upstream", "http://127.0.0.1:9/v1", "--calibration", "auto"])
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert "None" not in out and "model None" not in out
    assert "gnll ask's instruction prompts" in out and "chat" in out
    assert "--prompt-format chat" in out


def test_serve_warns_at_start_up_about_a_calibration_of_other_prompts(tmp_path):
    """A calibration fitted on gnll eval's few-shot prompts, served to questions asked as gnll ask
    asks them (same format name, instruction): one warning line in words, before listening."""
    import numpy as np

    from gnll.calibration import Calibrator, prompt_fingerprint

    rng = np.random.default_rng(0)
    g = rng.exponential(2.0, 500)
    cal = Calibrator(method="platt").fit(g, rng.uniform(size=500) < np.exp(-g / 2))
    cal.meta = {
        "measure": "g-nll",
        "model": "smollm2-135m-instruct",
        "prompt_format": "instruction",
        "prompt_fingerprint": prompt_fingerprint("Q: {question}\nA: Paris\n\nQuestion: {question}"),
        "prompt_description": "prompts of gnll eval task(s) triviaqa_short",
    }
    path = cal.save(tmp_path / "cal.json")
    args = ["--prompt-format", "instruction", "--calibration", str(path), "--policy", "flag"]
    res = _serve_cli(args)
    assert res.exit_code == 1, res.output
    out = " ".join(res.output.split())
    assert (
        "warning: the calibration was fitted on answers to prompts of gnll eval task(s) "
        "triviaqa_short, but is used on answers to questions asked as gnll ask asks them" in out
    )
    assert "sha256" not in out
