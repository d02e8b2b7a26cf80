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
from integration_helpers import QUESTION, proxy_record, require, vllm_and_proxy
from serve_helpers import ScriptedModel

from gnll.backends.base import Generation
from gnll.serving import ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread, free_port

require("litellm")
from gnll.integrations.litellm import UncertaintyHandler  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.server]
KEY = "sk-gnll-test-0123456789abcdef0123456789"  # the proxy refuses to start without a master key
EASY, HARD = QUESTION, "Explain the history of the Byzantine empire's coinage in detail."


def direct(srv, question, max_tokens=24):
    r = srv.client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
    )
    return r.choices[0]


def _config(tmp: Path, models: dict[str, tuple[str, str]], env: dict[str, str]) -> Path:
    """A LiteLLM proxy config: each model name routed to (LiteLLM's model, its server's URL), the
    environment ``env``, and gnll's proxy handler."""
    lines = ["model_list:"]
    for name, (model, url) in models.items():
        lines += [f"  - model_name: {name}", "    litellm_params:", f"      model: {model}"]
        lines += [f"      api_base: {url}/v1", "      api_key: unused"]
    lines += ["environment_variables:", *[f'  {k}: "{v}"' for k, v in env.items()]]
    lines += ["litellm_settings:", "  callbacks: gnll.integrations.litellm.proxy_handler"]
    lines += ["general_settings:", f"  master_key: {KEY}"]
    path = tmp / "config.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_config(tmp: Path, upstream: str, vllm: str, **env: str) -> Path:
    models = {
        "smollm": ("openai/smollm2-135m-instruct", upstream),
        "recorded-vllm": ("hosted_vllm/served-model", vllm),
    }
    return _config(tmp, models, env)


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
        ref = proxy_record(reference)
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
    assert abs(r.choices[0].uncertainty["g_nll"] - ref["g_nll"]) <= 1e-6  # same path: the server's record of the log-probs LiteLLM re-reads
    assert r.choices[0].uncertainty["num_tokens"] == ref["num_tokens"] == 1
    chunks = list(client.chat.completions.create(model="recorded-vllm", messages=ask, stream=True))
    last = [c for c in chunks if c.choices and getattr(c.choices[0], "uncertainty", None)]
    assert len(last) == 1 and abs(last[0].choices[0].uncertainty["g_nll"] - ref["g_nll"]) <= 1e-6  # same path: the server's record of the log-probs LiteLLM re-reads


def check_proxy(proxy, easy, hard):
    """gnll serve on the embedded model through the LiteLLM proxy under a refuse policy."""
    client = proxy.client()
    raw = client.chat.completions.with_raw_response.create(
        model="smollm", messages=[{"role": "user", "content": EASY}], max_tokens=24
    )
    r = raw.parse()
    u = r.choices[0].uncertainty
    assert r.choices[0].message.content == easy.message.content
    assert abs(u["g_nll"] - easy.uncertainty["g_nll"]) <= 1e-6  # same path: the server's record of the log-probs LiteLLM re-reads
    assert u["num_tokens"] == easy.uncertainty["num_tokens"] and u["abstain"] is False
    assert r.choices[0].logprobs is None  # the handler asked for them, the client did not
    assert float(raw.headers["x-uncertainty-g-nll"]) == pytest.approx(u["g_nll"], rel=1e-5)
    assert raw.headers["x-uncertainty-abstain"] == "false"

    refused = client.chat.completions.create(
        model="smollm", messages=[{"role": "user", "content": HARD}], max_tokens=24
    ).choices[0]
    assert refused.message.content == "I am not confident enough to answer this."
    assert refused.uncertainty["refused"] is True and refused.uncertainty["abstain"] is True
    assert abs(refused.uncertainty["g_nll"] - hard.uncertainty["g_nll"]) <= 1e-6  # same path: the server's record of the log-probs LiteLLM re-reads
    assert "spans" in refused.uncertainty and refused.uncertainty["spans"] is None

    # a temperature is no way around the refuse policy's decision on the greedy answer
    with pytest.raises(openai.BadRequestError, match="greedy answer"):
        client.chat.completions.create(
            model="smollm", messages=[{"role": "user", "content": HARD}], temperature=0.7
        )

    # streams: the refuse policy holds the answer back; the uncertainty comes last
    def stream(content: str) -> tuple[list, str]:
        chunks = list(
            client.chat.completions.create(
                model="smollm",
                messages=[{"role": "user", "content": content}],
                max_tokens=24,
                stream=True,
            )
        )
        return chunks, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    chunks, text = stream(EASY)
    last = [c for c in chunks if c.choices and getattr(c.choices[0], "uncertainty", None)]
    assert text == easy.message.content and len(last) == 1
    assert abs(last[0].choices[0].uncertainty["g_nll"] - easy.uncertainty["g_nll"]) <= 1e-6  # same path: the server's record of the log-probs LiteLLM re-reads
    _, text = stream(HARD)
    assert text == "I am not confident enough to answer this."


def test_sdk_logger_and_recorded_vllm_answer():
    """`litellm.completion` on the recorded vLLM answer: the logger's G-NLL is what `gnll serve
    --upstream` says for it, whole and streamed."""
    import litellm

    seen = []
    handler = UncertaintyHandler(server="vllm", on_uncertainty=lambda rec, kw: seen.append(rec))
    with vllm_and_proxy() as (vllm, proxy, app):
        ref = proxy_record(proxy)
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
        assert seen and abs(seen[0].g_nll - ref["g_nll"]) <= 1e-6  # same path: the server's record of the log-probs LiteLLM re-reads
        assert seen[0].num_tokens == ref["num_tokens"] == 1


# --------------------------------------------------------------------------- escalate
class BigModel(ScriptedModel):
    """The larger model: a sure "Lyon." (G-NLL 0.75) to every question, so who answered shows."""

    name = "big"

    def generate(self, prompts, config=None, **kwargs):
        self.calls.append(len(prompts))
        return [[Generation("Lyon.", [7, 8], ["Lyon", "."], [-0.5, -0.25], "eos")] for _ in prompts]


def scripted_servers(threshold: float):
    """The small (scripted) and large (`big`) models behind plain `gnll serve`s for the proxy, and
    `gnll serve --policy escalate` from the one to the other: the decision to compare with."""
    from gnll.serving import AbstentionPolicy

    small = ServerThread(build_inprocess_app(ScriptedModel(), ServeSettings(), max_wait_ms=5))
    large = ServerThread(build_inprocess_app(BigModel(), ServeSettings(), max_wait_ms=5))
    small.__enter__()
    large.__enter__()
    cascade = ServerThread(
        build_inprocess_app(
            ScriptedModel(),
            ServeSettings(policy=AbstentionPolicy(mode="escalate", threshold=threshold)),
            max_wait_ms=5,
            escalate_to=large.url + "/v1",
            escalate_model="big",
        )
    )
    cascade.__enter__()
    return small, large, cascade


def escalate_config(tmp: Path, small: str, large: str, threshold: float) -> Path:
    models = {"small": ("openai/scripted", small), "large": ("openai/big", large)}
    env = {
        "GNLL_POLICY": "escalate",
        "GNLL_THRESHOLD": f"{threshold}",
        "GNLL_SERVER": "gnll",
        "GNLL_ESCALATE_MODEL": "large",
    }
    return _config(tmp, models, env)


@pytest.mark.e2e
def test_proxy_escalates_uncertain_answers_to_the_larger_model(tmp_path):
    """`GNLL_POLICY: escalate`: the small model's sure answer stays, its unsure one is answered by
    the model GNLL_ESCALATE_MODEL names, with the local G-NLL that decided it; the same decisions
    and numbers as `gnll serve --policy escalate` at the same threshold, whole and streamed."""
    threshold = 1.0  # SURE's G-NLL is 0.03, UNSURE's 5.0
    servers = scripted_servers(threshold)
    small, large, cascade = servers
    try:
        ref = openai.OpenAI(base_url=cascade.url + "/v1", api_key="x", max_retries=0)
        config = escalate_config(tmp_path, small.url, large.url, threshold)
        with LiteLLMProxy(config, tmp_path / "litellm.log") as proxy:
            client = proxy.client()
            for question, answered_by, text in [
                ("capital?", "small", "Paris."),
                ("unsure", "large", "Lyon."),
            ]:
                ask = [{"role": "user", "content": question}]
                want = ref.chat.completions.create(model="scripted", messages=ask).choices[0]
                w = want.uncertainty
                raw = client.chat.completions.with_raw_response.create(model="small", messages=ask)
                got = raw.parse().choices[0]
                u = got.uncertainty
                assert got.message.content == want.message.content == text
                assert u["answered_by"] == answered_by
                assert u["escalated"] is w["escalated"] is (answered_by == "large")
                assert u["g_nll"] == pytest.approx(w["g_nll"], abs=1e-6)  # same path: the server's record of the log-probs LiteLLM re-reads
                assert float(raw.headers["x-uncertainty-g-nll"]) == pytest.approx(u["g_nll"])
                assert raw.headers["x-answered-by"] == answered_by
                if u["escalated"]:
                    assert u["g_nll"] == pytest.approx(0.75)  # the large answer's own G-NLL
                    local = u["local"]
                    assert local["g_nll"] == pytest.approx(w["local"]["g_nll"], abs=1e-6)  # same path: the server's record of the log-probs LiteLLM re-reads
                    assert local["g_nll"] == pytest.approx(5.0) and local["abstain"] is True
                    assert local["text"] == w["local"]["text"] == "Maybe Lyon"
                    assert local["model"] == "small"
                else:
                    assert u["g_nll"] < threshold and u["abstain"] is False and "local" not in u
                    assert u.get("local") is None

                chunks = list(
                    client.chat.completions.create(model="small", messages=ask, stream=True)
                )
                streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                last = [
                    c for c in chunks if c.choices and getattr(c.choices[0], "uncertainty", None)
                ]
                assert streamed == text and len(last) == 1
                lu = last[0].choices[0].uncertainty
                assert lu["answered_by"] == answered_by
                assert lu["g_nll"] == pytest.approx(u["g_nll"], abs=1e-6)  # same path: the server's record of the log-probs LiteLLM re-reads
                assert last[0].choices[0].finish_reason == "stop"

            # a sampled answer has no G-NLL to escalate on: it streams live and stays local
            chunks = list(
                client.chat.completions.create(
                    model="small",
                    messages=[{"role": "user", "content": "unsure"}],
                    temperature=0.7,
                    stream=True,
                )
            )
            streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            last = [c for c in chunks if c.choices and getattr(c.choices[0], "uncertainty", None)]
            assert streamed == "Maybe Lyon" and len(last) == 1
            lu = last[0].choices[0].uncertainty
            assert lu["answered_by"] == "small" and lu["escalated"] is False
            assert lu["decoding"] == "sampled" and lu.get("g_nll") is None

            # the large model down: the local answer, with why it was not escalated (as gnll serve)
            large.__exit__(None, None, None)
            ask = [{"role": "user", "content": "unsure"}]
            want = ref.chat.completions.create(model="scripted", messages=ask).choices[0]
            got = client.chat.completions.create(model="small", messages=ask).choices[0]
            assert got.message.content == want.message.content == "Maybe Lyon"
            u, w = got.uncertainty, want.uncertainty
            assert u["answered_by"] == "small" and u["escalated"] is w["escalated"] is False
            assert u["escalation_error"] and w["escalation_error"]
            assert u["g_nll"] == pytest.approx(w["g_nll"], abs=1e-6) and u["abstain"] is True  # same path: the server's record of the log-probs LiteLLM re-reads
        # Each answer was scored once, in the call hooks: the success-logging callback logged no
        # ERROR (it scored again, after the log-probs were removed, and raised on every request).
        log = (tmp_path / "litellm.log").read_text()
        assert "LoggingError" not in log and "carries no log-probs" not in log, log[-3000:]
    finally:
        for srv in servers:
            srv.__exit__(None, None, None)


def test_escalate_needs_the_larger_model_named(monkeypatch):
    monkeypatch.delenv("GNLL_ESCALATE_MODEL", raising=False)
    with pytest.raises(ValueError, match="GNLL_ESCALATE_MODEL"):
        UncertaintyHandler(policy="escalate", threshold=1.0).scorer  # noqa: B018
    assert UncertaintyHandler(policy="escalate", threshold=1.0, escalate_model="large").scorer


@pytest.mark.model
@pytest.mark.e2e
def test_decisions_through_litellm_sdk_and_proxy(served, smollm, tmp_path):
    """`litellm.decisions` and LiteLLM's proxy (a config that routes `/v1/decisions` to `gnll
    serve`, called with the openai SDK's `decisions.create`) return gnll's exact probabilities."""
    import litellm

    from gnll import decide

    text = "The parcel arrived two weeks late and the box was crushed."
    questions = [
        {"type": "predicate", "name": "late", "instructions": "Was the parcel late?"},
        {
            "type": "choice",
            "name": "topic",
            "instructions": "What is the message about?",
            "choices": [{"value": "delivery delay"}, {"value": "delivery damage"}],
        },
    ]
    ref = decide(smollm, text, questions)

    def check(answers):
        late, topic = answers
        assert late.probability == pytest.approx(ref.answers[0].probability, abs=1e-4)
        assert topic.choice == ref.answers[1].choice
        got = {o.value: o.probability for o in topic.probabilities}
        assert got == pytest.approx(
            {o.value: o.probability for o in ref.answers[1].options}, abs=1e-4
        )

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    check(
        litellm.decisions(
            model="openai/smollm2-135m-instruct",
            api_base=served.url + "/v1",
            api_key="unused",
            input=text,
            questions=questions,
        ).answers
    )
    config = tmp_path / "config.yaml"
    config.write_text(
        "\n".join(
            [
                "model_list:",
                "  - model_name: gnll-decide",
                "    litellm_params:",
                "      model: openai/smollm2-135m-instruct",
                f"      api_base: {served.url}/v1",
                "      api_key: unused",
                "general_settings:",
                f"  master_key: {KEY}",
            ]
        )
        + "\n"
    )
    with LiteLLMProxy(config, tmp_path / "litellm.log") as proxy:
        d = proxy.client().decisions.create(model="gnll-decide", input=text, questions=questions)
    check(d.answers)
