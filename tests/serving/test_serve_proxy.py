"""`gnll serve --upstream`: the proxy in front of a real OpenAI-compatible server.

The upstream is `gnll serve` itself (in-process mode, scripted stand-in model, on its own loopback
port), so the proxy's numbers can be compared with what the upstream computed directly. The proxy
reads the upstream's log-probs with the server backend's parser (``gnll.backends.openai.parse``).
"""

from __future__ import annotations

import httpx
import openai
import pytest
from serve_helpers import UNSURE, ScriptedModel

from gnll.serving import AbstentionPolicy, ServeSettings, build_inprocess_app, create_app
from gnll.serving.proxy import ProxyService
from gnll.serving.server import ServerThread


@pytest.fixture(scope="module")
def upstream():
    model = ScriptedModel()
    with ServerThread(build_inprocess_app(model, ServeSettings(), max_wait_ms=1)) as srv:
        srv.model = model
        yield srv


def proxy(upstream_url, timeout=30.0, **settings):
    service = ProxyService(upstream_url + "/v1", timeout=timeout)
    return ServerThread(create_app(service, ServeSettings(**settings)))


def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)


def test_proxy_adds_the_same_uncertainty_as_the_upstream(upstream):
    with proxy(upstream.url) as px:
        direct = client(upstream).completions.create(model="scripted", prompt="unsure", logprobs=1)
        via = client(px).completions.create(model="scripted", prompt="unsure")
        u = via.choices[0].uncertainty
        assert via.choices[0].text == direct.choices[0].text
        assert u["g_nll"] == pytest.approx(direct.choices[0].uncertainty["g_nll"])
        assert u["num_tokens"] == 2 and u["decoding"] == "greedy"
        assert via.choices[0].logprobs is None  # the proxy asked for them; the client did not
        assert upstream.model.configs[-1].strategy == "greedy"

        chat = client(px).chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "unsure"}], logprobs=True
        )
        assert chat.choices[0].uncertainty["token_logprobs"] == UNSURE[1]
        assert [e.logprob for e in chat.choices[0].logprobs.content] == UNSURE[1]
        models = client(px).models.list()
        assert models.data[0].id == "scripted"


def test_proxy_sampling_is_labelled(upstream):
    with proxy(upstream.url) as px:
        r = client(px).completions.create(model="scripted", prompt="unsure", temperature=0.9)
        assert r.choices[0].uncertainty["decoding"] == "sampled"
        assert r.choices[0].uncertainty["g_nll"] is None
        assert upstream.model.configs[-1].strategy == "sample"


@pytest.mark.parametrize("chat", [False, True])
def test_proxy_streams_through_with_uncertainty_last(upstream, chat):
    with proxy(upstream.url) as px:
        c = client(px)
        if chat:
            chunks = list(
                c.chat.completions.create(
                    model="scripted", messages=[{"role": "user", "content": "unsure"}], stream=True
                )
            )
            text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        else:
            chunks = list(c.completions.create(model="scripted", prompt="unsure", stream=True))
            text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        assert text == "Maybe Lyon"
        last = [ch for ch in chunks if ch.choices and getattr(ch.choices[0], "uncertainty", None)]
        assert len(last) == 1 and last[0].choices[0].uncertainty["g_nll"] == pytest.approx(5.0)


def test_proxy_stream_carries_uncertainty_in_the_last_chunk_not_in_headers(upstream):
    # Headers precede the relayed body, whose uncertainty is known only at its end.
    body = {"model": "scripted", "prompt": "unsure", "stream": True}
    with proxy(upstream.url) as px:
        with httpx.stream("POST", px.url + "/v1/completions", json=body, timeout=30) as r:
            assert r.status_code == 200
            assert not [h for h in r.headers if h.lower().startswith("x-uncertainty")]
            lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        plain = httpx.post(px.url + "/v1/completions", json={**body, "stream": False}, timeout=30)
        metrics = httpx.get(px.url + "/metrics").text
    assert plain.headers["x-uncertainty-g-nll"] == "5"
    # The streamed answer counts in the metrics once its stream has ended (the plain one too).
    assert "gnll_answer_g_nll_count 2.0" in metrics
    assert lines[-1] == "data: [DONE]" and '"uncertainty"' in lines[-2]


def test_proxy_policy_refuse(upstream):
    with proxy(upstream.url, policy=AbstentionPolicy(mode="refuse", threshold=1.0)) as px:
        r = client(px).chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": "unsure"}]
        )
        assert r.choices[0].message.content == AbstentionPolicy().refusal
        assert r.choices[0].uncertainty["refused"] is True
        assert "Maybe" not in r.model_dump_json()  # the refused answer is not sent anywhere
        assert r.choices[0].finish_reason == "stop"
        chunks = list(
            client(px).chat.completions.create(
                model="scripted",
                messages=[{"role": "user", "content": "unsure"}],
                stream=True,
                logprobs=True,
            )
        )
        assert (
            "".join(c.choices[0].delta.content or "" for c in chunks)
            == r.choices[0].message.content
        )
        assert not any("Lyon" in c.model_dump_json() for c in chunks)


def test_upstream_4xx_passes_through_with_its_message(upstream):
    with (
        proxy(upstream.url) as px,
        pytest.raises(openai.BadRequestError, match="top_p < 1 is not supported"),
    ):
        client(px).completions.create(model="scripted", prompt="x", temperature=1, top_p=0.5)


def test_upstream_timeout_is_504():
    slow = ScriptedModel(delay=3.0)
    with (
        ServerThread(build_inprocess_app(slow, ServeSettings())) as up,
        proxy(up.url, timeout=1.0) as px,
    ):
        r = httpx.post(px.url + "/v1/completions", json={"prompt": "x"}, timeout=30)
        assert r.status_code == 504
        assert "did not answer within 1 s" in r.json()["error"]["message"]


def test_upstream_5xx_is_502(upstream):
    class Broken(ScriptedModel):
        def generate(self, prompts, config=None, **kw):
            raise RuntimeError("GPU on fire")

    with ServerThread(build_inprocess_app(Broken(), ServeSettings())) as up, proxy(up.url) as px:
        r = httpx.post(px.url + "/v1/completions", json={"prompt": "x"}, timeout=30)
        assert r.status_code == 502
        assert "answered 500" in r.json()["error"]["message"]
