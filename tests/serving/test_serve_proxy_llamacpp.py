"""`gnll serve --upstream` in front of a real llama.cpp server (llama-cpp-python, scripts/test.sh
builds it) on the GGUF file the embedded SmolLM2 ships: the proxy's G-NLL equals the server backend's
on the same server, greedy decoding is pinned, streaming relays with the uncertainty last."""

from __future__ import annotations

import httpx
import openai
import pytest

from gnll import GenerationConfig, load_model
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


@pytest.fixture(scope="module")
def proxy(llama):
    app = create_app(ProxyService(llama.base_url, timeout=120), ServeSettings())
    with ServerThread(app) as srv:
        srv.client = openai.OpenAI(
            base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120
        )
        yield srv


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
    assert u["g_nll"] == pytest.approx(g_nll(gen.token_logprobs), abs=1e-6)
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
        whole.uncertainty["g_nll"], abs=1e-6
    )
