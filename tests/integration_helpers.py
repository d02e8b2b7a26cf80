"""Upstreams for the framework integration tests (tests/integrations): `gnll serve` with the embedded
model, and a recorded vLLM answer (tests/fixtures/vllm/chat_stop.json) served as vLLM serves it,
whole or streamed one token per chunk, with `gnll serve --upstream` in front of it as the reference."""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import os
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from gnll.serving import ServeSettings, create_app
from gnll.serving.proxy import ProxyService
from gnll.serving.server import ServerThread

VLLM = Path(__file__).parent / "fixtures" / "vllm"
QUESTION = "What is the capital of France?"


def require(module: str):
    """Import a framework the tests need: on CI (``CI`` set; scripts/test.sh installs the extras)
    a missing one fails the run, elsewhere its tests are skipped."""
    import pytest

    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module}: pip install -e '.[integrations]'")


def vllm_chat_answer(tokens: list[str], logprobs: list[float], eos: float) -> dict:
    """A vLLM chat answer in the recorded shape (chat_stop.json) that ends at EOS: vLLM reports
    the EOS token's log-prob (its text empty) and ``stop_reason: null``."""
    answer = json.loads((VLLM / "chat_stop.json").read_text())
    choice = answer["choices"][0]
    entries = [
        {
            "token": t,
            "logprob": lp,
            "bytes": list(t.encode()),
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())}],
        }
        for t, lp in [*zip(tokens, logprobs, strict=True), ("", eos)]
    ]
    choice["message"]["content"] = "".join(tokens)
    choice["logprobs"]["content"] = entries
    choice.update(finish_reason="stop", stop_reason=None, token_ids=list(range(len(entries))))
    return answer


def vllm_app(answer: dict | None = None) -> FastAPI:
    """The recorded vLLM server: ``/v1/models`` and ``/v1/chat/completions`` (``stream`` too)."""
    models = json.loads((VLLM / "models.json").read_text())
    answer = answer or json.loads((VLLM / "chat_stop.json").read_text())
    app = FastAPI()
    app.state.requests = []

    @app.get("/v1/models")
    def _models() -> dict:
        return models

    @app.post("/v1/chat/completions")
    async def _chat(request: Request):
        body = await request.json()
        app.state.requests.append(body)
        data = copy.deepcopy(answer)
        if not body.get("stream"):
            return JSONResponse(data)
        return StreamingResponse(_stream(data), media_type="text/event-stream")

    return app


def _stream(data: dict):
    """vLLM's chunks: one token each, its text and log-prob; the last with the finish reason."""
    choice = data["choices"][0]
    entries = choice["logprobs"]["content"]
    text = choice["message"]["content"]
    base = {k: data[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    pos = 0
    for i, e in enumerate(entries):
        piece = text[pos : pos + len(e["token"])]
        pos += len(piece)
        last = i == len(entries) - 1
        c = {
            "index": 0,
            "delta": {"role": "assistant", "content": piece} if i == 0 else {"content": piece},
            "logprobs": {"content": [e]},
            "finish_reason": choice["finish_reason"] if last else None,
        }
        if last:
            c["stop_reason"] = choice["stop_reason"]
        yield f"data: {json.dumps(base | {'choices': [c]})}\n\n"
    yield "data: [DONE]\n\n"


@contextlib.contextmanager
def vllm_and_proxy(answer: dict | None = None, **settings):
    """The recorded vLLM server, and `gnll serve --upstream` in front of it."""
    app = vllm_app(answer)
    with ServerThread(app) as vllm:
        service = ProxyService(vllm.url + "/v1", server="vllm", timeout=30)
        with ServerThread(create_app(service, ServeSettings(**settings))) as proxy:
            yield vllm, proxy, app


def proxy_record(proxy, content: str = QUESTION) -> dict:
    """The proxy's own record of its answer to ``content`` (the reference an integration's
    numbers must equal)."""
    import openai

    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
    messages = [{"role": "user", "content": content}]
    reply = client.chat.completions.create(model="served-model", messages=messages)
    return reply.choices[0].uncertainty


class Recorder:
    """The ``uncertainty`` objects the server put on the responses an httpx client received
    (bodies and event streams alike), in the order the responses arrived: what a framework got,
    before it dropped them. :attr:`ids` holds each record's response id (concurrent requests, as a
    framework's batch sends them, may arrive in any order: match by id)."""

    def __init__(self) -> None:
        self.records: list[dict] = []
        self.ids: list[str | None] = []

    def _take(self, response) -> None:
        if not response.request.url.path.endswith("/completions"):
            return
        text = response.text
        if "text/event-stream" in response.headers.get("content-type", ""):
            for line in text.splitlines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    for c in chunk.get("choices") or []:
                        if c.get("uncertainty"):
                            self.records.append(c["uncertainty"])
                            self.ids.append(chunk.get("id"))
        else:
            body = json.loads(text)
            for c in body["choices"]:
                self.records.append(c["uncertainty"])
                self.ids.append(body.get("id"))

    def client(self):
        import httpx

        def hook(response):
            response.read()
            self._take(response)

        return httpx.Client(event_hooks={"response": [hook]}, timeout=120)

    def async_client(self):
        import httpx

        async def hook(response):
            await response.aread()
            self._take(response)

        return httpx.AsyncClient(event_hooks={"response": [hook]}, timeout=120)
