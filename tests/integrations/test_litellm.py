"""LiteLLM: the proxy started as a real process from its config.yaml, with gnll's handler named in
it, in front of `gnll serve` on the embedded model and called with the official `openai` client;
and the SDK logger on `litellm.completion`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from integration_helpers import QUESTION, require, vllm_and_proxy

from gnll.serving import ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread, free_port

require("litellm")
from gnll.integrations.litellm import UncertaintyHandler  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.server]
KEY = "sk-gnll-test-0123456789abcdef0123456789"  # the proxy refuses to start without a master key
EASY, HARD = QUESTION, "Explain the history of the Byzantine empire's coinage in detail."


@pytest.fixture(scope="module")
def served(smollm):
    with ServerThread(build_inprocess_app(smollm, ServeSettings(), max_wait_ms=1)) as srv:
        srv.client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        yield srv


def direct(srv, question, max_tokens=24):
    r = srv.client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
    )
    return r.choices[0]


def write_config(tmp: Path, upstream: str, vllm: str, **env: str) -> Path:
    lines = [
        "model_list:",
        "  - model_name: smollm",
        "    litellm_params:",
        "      model: openai/smollm2-135m-instruct",
        f"      api_base: {upstream}/v1",
        "      api_key: unused",
        "  - model_name: recorded-vllm",
        "    litellm_params:",
        "      model: hosted_vllm/served-model",
        f"      api_base: {vllm}/v1",
        "      api_key: unused",
        "environment_variables:",
        *[f'  {k}: "{v}"' for k, v in env.items()],
        "litellm_settings:",
        "  callbacks: gnll.integrations.litellm.proxy_handler",
        "general_settings:",
        f"  master_key: {KEY}",
    ]
    path = tmp / "config.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


class LiteLLMProxy:
    """`litellm --config FILE` as a real process on a loopback port."""

    def __init__(self, config: Path, log: Path) -> None:
        self.port = free_port("127.0.0.1")
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
        cmd = [sys.executable, "-c", "from litellm_cli.main import proxy_server; proxy_server()"]
        cmd += ["--config", str(config), "--host", "127.0.0.1", "--port", str(self.port)]
        self.log = log
        self.proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> LiteLLMProxy:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"litellm exited:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health/liveliness", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError(f"litellm did not start:\n{self.log.read_text()[-3000:]}")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.mark.model
@pytest.mark.e2e
def test_proxy_adds_uncertainty_headers_and_refuses(served, tmp_path):
    easy, hard = direct(served, EASY), direct(served, HARD)
    assert easy.uncertainty["g_nll"] < hard.uncertainty["g_nll"]
    threshold = (easy.uncertainty["g_nll"] + hard.uncertainty["g_nll"]) / 2
    with vllm_and_proxy() as (vllm, reference, _):
        ref = (
            openai.OpenAI(base_url=reference.url + "/v1", api_key="x", max_retries=0)
            .chat.completions.create(
                model="served-model", messages=[{"role": "user", "content": QUESTION}]
            )
            .choices[0]
            .uncertainty
        )
        config = write_config(
            tmp_path,
            served.url,
            vllm.url,
            GNLL_POLICY="refuse",
            GNLL_THRESHOLD=f"{threshold}",
            GNLL_SERVER="gnll",
        )
        with LiteLLMProxy(config, tmp_path / "litellm.log") as proxy:
            check_recorded_vllm(proxy, ref)
            check_proxy(proxy, easy, hard)


def check_recorded_vllm(proxy, ref):
    """The recorded vLLM answer through the LiteLLM proxy: what `gnll serve --upstream` says."""
    client = proxy.client()
    ask = [{"role": "user", "content": QUESTION}]
    r = client.chat.completions.create(model="recorded-vllm", messages=ask)
    assert r.choices[0].message.content.strip() == "Paris"
    assert abs(r.choices[0].uncertainty["g_nll"] - ref["g_nll"]) <= 1e-6
    assert r.choices[0].uncertainty["num_tokens"] == ref["num_tokens"] == 1
    chunks = list(client.chat.completions.create(model="recorded-vllm", messages=ask, stream=True))
    last = [c for c in chunks if c.choices and getattr(c.choices[0], "uncertainty", None)]
    assert len(last) == 1 and abs(last[0].choices[0].uncertainty["g_nll"] - ref["g_nll"]) <= 1e-6


def check_proxy(proxy, easy, hard):
    """gnll serve on the embedded model through the LiteLLM proxy under a refuse policy."""
    client = proxy.client()
    raw = client.chat.completions.with_raw_response.create(
        model="smollm", messages=[{"role": "user", "content": EASY}], max_tokens=24
    )
    r = raw.parse()
    u = r.choices[0].uncertainty
    assert r.choices[0].message.content == easy.message.content
    assert abs(u["g_nll"] - easy.uncertainty["g_nll"]) <= 1e-6
    assert u["num_tokens"] == easy.uncertainty["num_tokens"] and u["abstain"] is False
    assert r.choices[0].logprobs is None  # the handler asked for them, the client did not
    assert float(raw.headers["x-uncertainty-g-nll"]) == pytest.approx(u["g_nll"], rel=1e-5)
    assert raw.headers["x-uncertainty-abstain"] == "false"

    refused = client.chat.completions.create(
        model="smollm", messages=[{"role": "user", "content": HARD}], max_tokens=24
    ).choices[0]
    assert refused.message.content == "I am not confident enough to answer this."
    assert refused.uncertainty["refused"] is True and refused.uncertainty["abstain"] is True
    assert abs(refused.uncertainty["g_nll"] - hard.uncertainty["g_nll"]) <= 1e-6
    assert "spans" in refused.uncertainty and refused.uncertainty["spans"] is None

    # a temperature is no way around the refuse policy's decision on the greedy answer
    with pytest.raises(openai.BadRequestError, match="greedy answer"):
        client.chat.completions.create(
            model="smollm", messages=[{"role": "user", "content": HARD}], temperature=0.7
        )

    # streams: the refuse policy holds the answer back; the uncertainty comes last
    chunks = list(
        client.chat.completions.create(
            model="smollm",
            messages=[{"role": "user", "content": EASY}],
            max_tokens=24,
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    last = [c for c in chunks if c.choices and getattr(c.choices[0], "uncertainty", None)]
    assert text == easy.message.content and len(last) == 1
    assert abs(last[0].choices[0].uncertainty["g_nll"] - easy.uncertainty["g_nll"]) <= 1e-6
    chunks = list(
        client.chat.completions.create(
            model="smollm",
            messages=[{"role": "user", "content": HARD}],
            max_tokens=24,
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "I am not confident enough to answer this."


def test_sdk_logger_and_recorded_vllm_answer():
    """`litellm.completion` on the recorded vLLM answer: the logger's G-NLL is what `gnll serve
    --upstream` says for it, whole and streamed."""
    import litellm

    seen = []
    handler = UncertaintyHandler(server="vllm", on_uncertainty=lambda rec, kw: seen.append(rec))
    with vllm_and_proxy() as (vllm, proxy, app):
        ref = (
            openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
            .chat.completions.create(
                model="served-model", messages=[{"role": "user", "content": QUESTION}]
            )
            .choices[0]
            .uncertainty
        )
        old = litellm.callbacks
        litellm.callbacks = [handler]
        try:
            response = litellm.completion(
                model="openai/served-model",
                api_base=vllm.url + "/v1",
                api_key="x",
                messages=[{"role": "user", "content": QUESTION}],
                logprobs=True,
                top_logprobs=1,
                temperature=0,
            )
            deadline = time.monotonic() + 20  # success callbacks run after the call returns
            while not seen and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            litellm.callbacks = old
        assert response.choices[0].message.content == " Paris"
        assert seen and abs(seen[0].g_nll - ref["g_nll"]) <= 1e-6
        assert seen[0].num_tokens == ref["num_tokens"] == 1
