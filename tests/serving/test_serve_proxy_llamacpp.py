"""`gnll serve --upstream` in front of a real llama.cpp server (llama-cpp-python, scripts/test.sh
builds it) on the GGUF file the embedded SmolLM2 ships: the proxy's G-NLL equals the server backend's
on the same server, greedy decoding is pinned, streaming relays with the uncertainty last, 8
concurrent streams all finish when the server is started as docs/servers.md says
(``--interrupt_requests false``), and with llama-cpp-python's default (which cuts a running stream
when another request arrives) ``gnll doctor`` fails the server and the proxy says what happened."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from serve_helpers import access_log, concurrent_streams
from typer.testing import CliRunner

from gnll import GenerationConfig, load_model
from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.backends.openai.launch import LlamaServer
from gnll.cli.main import app as cli
from gnll.measures import g_nll
from gnll.serving import ServeSettings, create_app
from gnll.serving.proxy import ProxyService
from gnll.serving.server import ServerThread

pytestmark = pytest.mark.server

MODEL = "smollm2-135m-instruct"
PROMPT = "Answer the following question as briefly as possible.\nQuestion: What is the capital of France?\nAnswer:"


@pytest.fixture(scope="module")
def llama(llama_server):
    """The session's llama.cpp server (conftest), shared with tests/backends/test_server_llamacpp.py."""
    return llama_server


def proxy_for(base_url: str) -> ServerThread:
    return ServerThread(create_app(ProxyService(base_url, timeout=300), ServeSettings()))


@pytest.fixture(scope="module")
def proxy(llama):
    with proxy_for(llama.base_url) as srv:
        srv.client = openai.OpenAI(
            base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120
        )
        yield srv


@pytest.fixture(scope="module")
def interrupting(gguf):
    """llama-cpp-python with its own default, --interrupt_requests true."""
    with LlamaServer(gguf, MODEL, interrupt_requests=True, lifetime=1200) as server:
        yield server


def eight_streams(url: str) -> list[dict]:
    """8 chat streams at once (serve_helpers.concurrent_streams)."""
    return concurrent_streams(url, MODEL, max_tokens=12)


def test_proxy_recognises_llamacpp_and_matches_the_server_backend(llama, proxy):
    health = httpx.get(proxy.url + "/health").json()
    assert health["mode"] == "proxy" and health["server"] == "llama-cpp-python"
    r = proxy.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=20,
        stop=["\n"],
        logprobs=True,
    ).choices[0]
    u = r.uncertainty
    assert "Paris" in r.message.content and u["decoding"] == "greedy" and u["num_tokens"] > 0
    backend = load_model(MODEL, backend="openai", base_url=llama.base_url, concurrency=1)
    [[gen]] = backend.generate([PROMPT], GenerationConfig.greedy(max_new_tokens=20, stop=("\n",)))
    assert gen.text == r.message.content.strip()
    assert u["g_nll"] == pytest.approx(g_nll(gen.token_logprobs), abs=BATCH_INVARIANCE_ATOL)
    assert u["tokens"] == gen.tokens


def test_proxy_streams_from_llamacpp(proxy):
    kwargs = dict(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=20, stop=["\n"]
    )
    whole = proxy.client.chat.completions.create(**kwargs).choices[0]
    chunks = list(proxy.client.chat.completions.create(stream=True, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    last = [c for c in chunks if c.choices and getattr(c.choices[0], "uncertainty", None)]
    assert text == whole.message.content
    assert len(last) == 1
    assert last[0].choices[0].uncertainty["g_nll"] == pytest.approx(
        whole.uncertainty["g_nll"], abs=BATCH_INVARIANCE_ATOL
    )


def test_eight_concurrent_streams_all_finish(proxy):
    """The server started as docs/servers.md says: every stream ends with one finish_reason and
    its uncertainty (before the fix of the documented command, 7 of 8 failed)."""
    started = time.perf_counter()
    results = eight_streams(proxy.url)
    print(
        f"8 concurrent streams, --interrupt_requests false: {time.perf_counter() - started:.1f} s"
    )
    assert [r["error"] for r in results] == [None] * 8
    for r in results:
        assert r["finishes"] == 1 and len(r["uncertainty"]) == 1 and r["text"]
        assert r["uncertainty"][0]["g_nll"] > 0


def test_the_default_interrupt_setting_is_caught_and_named(interrupting, caplog):
    wide = {"COLUMNS": "250", "TERMINAL_WIDTH": "250"}
    result = CliRunner().invoke(
        cli,
        ["doctor", "--base_url", interrupting.base_url, "--requests", "2", "--concurrency", "4"],
        env=wide,
    )
    assert result.exit_code == 1, result.output
    assert "concurrent streams" in result.output
    assert "--interrupt_requests false" in " ".join(result.output.split())
    with proxy_for(interrupting.base_url) as px, access_log(caplog):
        results = eight_streams(px.url)
        failed = [r["error"] for r in results if r["error"]]
        deadline = time.monotonic() + 10
        logged: list = []
        while time.monotonic() < deadline and len(logged) < len(failed):
            logged = [
                json.loads(x.message)
                for x in caplog.records
                if x.name == "gnll.serve.access" and '"error"' in x.message
            ]
            time.sleep(0.05)
    print(f"8 concurrent streams, llama-cpp-python's default: {len(failed)} of 8 cut short")
    assert failed, "llama-cpp-python's default no longer cuts concurrent streams"
    for message in failed:
        assert "without a finish_reason" in message and "--interrupt_requests false" in message
        assert "empty" not in message
    assert len(logged) == len(failed)
    assert all(e["status"] == 200 and e["stream_sent"] for e in logged)


def test_the_proxy_answers_as_openai_where_llamacpp_ignores_the_request(proxy):
    c = proxy.client
    ask = [{"role": "user", "content": "What is the capital of France?"}]
    with pytest.raises(openai.NotFoundError) as err:
        c.chat.completions.create(model="gpt-4o", messages=ask, max_tokens=5)
    assert err.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(model=MODEL, messages=ask, max_tokens=5, n=3, temperature=1)
    assert bad.value.param == "n"
    whole = c.chat.completions.create(model=MODEL, messages=ask, max_tokens=12)
    chunks = list(
        c.chat.completions.create(
            model=MODEL,
            messages=ask,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == [] and all(ch.choices for ch in chunks[:-1])
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens > 0
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
