"""`gnll serve --upstream` in front of a real vLLM (the run's shared ``vllm_server``, its CPU build
on the embedded SmolLM2, ``--max-model-len 2048``): the proxy leaves the token cap to vLLM and
forwards ``/tokenize``, so ``gnll doctor`` and gnll's own server backend work through it.

Before, a request for ``max_tokens=1000`` was a 400 ("above this server's limit of 512") although
vLLM serves 2,048 tokens, and ``gnll doctor --base_url <proxy>/v1`` crashed with "/tokenize answered
HTTP 404 ... this looks like a bug".
"""

from __future__ import annotations

import httpx
import pytest
from typer.testing import CliRunner

from gnll import GenerationConfig, load_model
from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.cli.main import app as cli
from gnll.serving import ServeSettings, build_proxy_app
from gnll.serving.server import ServerThread

pytestmark = pytest.mark.vllm

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_the_token_cap_is_vllms(vllm_proxy, vllm_server):
    body = {"model": vllm_server.model, "messages": QUESTION, "temperature": 0}
    r = httpx.post(
        vllm_proxy.url + "/v1/chat/completions", json={**body, "max_tokens": 1000}, timeout=300
    )
    assert r.status_code == 200, r.text  # was a 400: above gnll's 512
    assert r.json()["choices"][0]["uncertainty"]["g_nll"] > 0
    plain = httpx.post(vllm_proxy.url + "/v1/chat/completions", json=body, timeout=300)
    assert plain.status_code == 200 and "x-gnll-default-max-tokens" not in plain.headers
    assert (
        plain.json()["choices"][0]["message"]["content"]
        == r.json()["choices"][0]["message"]["content"]
    )
    # Above vLLM's max_model_len (2048): vLLM's own 400 comes back through the proxy.
    over = httpx.post(
        vllm_proxy.url + "/v1/chat/completions", json={**body, "max_tokens": 5000}, timeout=300
    )
    assert over.status_code == 400, over.text
    assert "upstream" in over.json()["error"]["message"]


def test_tokenize_is_forwarded(vllm_proxy, vllm_server):
    body = {"model": vllm_server.model, "messages": QUESTION, "add_generation_prompt": True}
    via = httpx.post(vllm_proxy.url + "/tokenize", json=body, timeout=60)
    direct = httpx.post(vllm_server.url + "/tokenize", json=body, timeout=60)
    assert via.status_code == 200 and via.json() == direct.json()


def test_gnll_backend_through_the_proxy_equals_vllm_direct(vllm_proxy, vllm_server):
    cfg = GenerationConfig.greedy(max_new_tokens=24)
    prompts = ["What is the capital of France?", "Who wrote Moby-Dick?"]
    got = []
    for url in (vllm_server.base_url, vllm_proxy.url + "/v1"):
        lm = load_model(vllm_server.model, backend="openai", base_url=url, chat=True)
        assert lm.info()["server"] == "vllm"
        got.append([g[0] for g in lm.generate(prompts, cfg)])
    for direct, via in zip(*got, strict=True):
        assert via.tokens == direct.tokens
        diffs = [abs(a - b) for a, b in zip(via.token_logprobs, direct.token_logprobs, strict=True)]
        assert max(diffs) <= BATCH_INVARIANCE_ATOL


def test_doctor_through_the_proxy_passes(vllm_proxy):
    result = CliRunner().invoke(
        cli, ["doctor", "--base_url", vllm_proxy.url + "/v1", "--requests", "2"]
    )
    assert result.exit_code == 0, result.output
    assert "looks like a bug" not in result.output and "HTTP 404" not in result.output


def test_an_answer_cut_early_reports_the_tokens_generated(vllm_server):
    """Under refuse --early the proxy closes vLLM's stream at the decision; its usage is the
    proxy's count (was null): the tokens received, and vLLM's own count of the prompt."""
    from gnll.serving import AbstentionPolicy

    settings = ServeSettings(
        policy=AbstentionPolicy(mode="refuse", threshold=2.0), early=True, upstream_timeout=300
    )
    long_q = [{"role": "user", "content": "Write a long essay about the history of Paris."}]
    body = {"model": vllm_server.model, "messages": long_q, "max_tokens": 200}
    with ServerThread(build_proxy_app(vllm_server.base_url, settings)) as px:
        r = httpx.post(px.url + "/v1/chat/completions", json=body, timeout=300).json()
    u = r["choices"][0]["uncertainty"]
    assert u["early"] is True and u["refused"] is True
    direct = httpx.post(
        vllm_server.base_url + "/chat/completions", json={**body, "max_tokens": 1}, timeout=300
    ).json()["usage"]
    usage = r["usage"]
    assert usage["completion_tokens"] == u["tokens_generated"] < 200
    assert usage["prompt_tokens"] == direct["prompt_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
