"""Two real llama.cpp servers (llama-cpp-python): `gnll serve --upstream SMOLLM2 --policy escalate
--escalate-to GEMMA --early` cuts SmolLM2's answer at the exact decision, SmolLM2's server stops
generating there, and Gemma-3-270M answers.

How "stops generating" is told: the SmolLM2 server process's CPU time. llama-cpp-python has no
``/slots`` endpoint (llama.cpp's own ``llama-server`` has), so the test compares the CPU seconds the
server spends on the escalated request with those it spends on the same request answered whole
(60 tokens): after the disconnect at the decision (a few tokens in) it must go idle although
Gemma's answer keeps the request open for seconds longer.
"""

from __future__ import annotations

import time

import httpx
import pytest
from serve_helpers import check_escalated_early
from test_serve_early_llamacpp import cpu_seconds

from gnll.serving import AbstentionPolicy, ServeSettings, build_proxy_app
from gnll.serving.server import ServerThread

pytestmark = pytest.mark.server

PROMPT = "Write a long story about a dragon who learns to cook. Chapter 1:"
MAX_TOKENS = 60


@pytest.fixture(scope="module")
def gemma_server(tmp_path_factory):
    from gnll.backends.embedded import EMBEDDED_MODELS
    from gnll.backends.openai.launch import LlamaServer

    gguf = EMBEDDED_MODELS["gemma-3-270m"].gguf(tmp_path_factory.mktemp("gemma-gguf"))
    # A context just long enough: llama-cpp-python turns its whole logit buffer (context x 262k
    # vocabulary) into log-probs as it generates.
    with LlamaServer(gguf, "gemma-3-270m", n_ctx=96, lifetime=600) as server:
        yield server


def test_the_small_server_goes_idle_at_the_decision_and_the_large_one_answers(
    llama_server, gemma_server
):
    small_pid = llama_server.process.pid
    body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    # Control: SmolLM2's whole answer (log-probs on, as the proxy asks) and its CPU seconds.
    before = cpu_seconds(small_pid)
    whole = httpx.post(
        llama_server.base_url + "/completions", json={**body, "logprobs": 1}, timeout=120
    ).json()
    whole_cpu = cpu_seconds(small_pid) - before
    assert whole["usage"]["completion_tokens"] == MAX_TOKENS, whole["usage"]
    assert whole_cpu > 0.3, f"the whole answer took {whole_cpu:.2f} CPU seconds"

    policy = AbstentionPolicy(mode="escalate", threshold=3.0)
    app = build_proxy_app(
        llama_server.base_url,
        ServeSettings(policy=policy, early=True, upstream_timeout=120),
        escalate_to=gemma_server.base_url,
    )
    with ServerThread(app) as px:
        before = cpu_seconds(small_pid)
        t = time.perf_counter()
        r = httpx.post(px.url + "/v1/completions", json=body, timeout=120)
        took = time.perf_counter() - t
        time.sleep(0.3)  # anything the server still does after the answer counts too
        escalated_cpu = cpu_seconds(small_pid) - before
    local = check_escalated_early(r, local_model="smollm2-135m-instruct", max_tokens=MAX_TOKENS)
    assert whole["choices"][0]["text"].startswith(local["text"])  # the same greedy answer, cut
    # Had SmolLM2 gone on, it would have spent the whole answer's CPU within the request (which
    # lasted for Gemma's answer); it spent a fraction: the tokens up to the decision.
    assert escalated_cpu < 0.5 * whole_cpu, (
        f"SmolLM2's server used {escalated_cpu:.2f} CPU s on the escalated request ({took:.1f} s, "
        f"decided at token {local['decided_at_token']}) against {whole_cpu:.2f} s for the whole "
        "answer: it kept generating after the proxy disconnected"
    )
