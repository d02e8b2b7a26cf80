"""`gnll serve` plumbing with a scripted stand-in model: OpenAI client compatibility, streaming,
dynamic batching, auth, limits, abstention policies, metrics, proxy errors.

A real server (uvicorn on a free loopback port, in a thread) answers the official ``openai`` client;
the model behind it is :class:`ScriptedModel`, so every expected number is known exactly. The same
routes on the real embedded model are in ``test_serve_model.py``.
"""

from __future__ import annotations

import math
import threading

import httpx
import openai
import pytest
from serve_helpers import SURE, UNSURE, ScriptedModel

from gnll.serving import AbstentionPolicy, ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread, free_port

KEY = "test-secret-key-123"


def g_nll(lps):
    return -math.fsum(lps)


@pytest.fixture
def server(request):
    """A server around a fresh ScriptedModel; parametrize indirectly with ServeSettings kwargs."""
    kwargs = getattr(request, "param", {})
    model = ScriptedModel(delay=kwargs.pop("delay", 0.0))
    settings = ServeSettings(**kwargs)
    with ServerThread(build_inprocess_app(model, settings, max_wait_ms=20)) as srv:
        srv.model = model
        yield srv


def client(srv, key="none"):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, timeout=30)


def test_completions_and_chat_carry_uncertainty(server):
    c = client(server)
    r = c.completions.create(model="scripted", prompt="unsure", max_tokens=5, logprobs=1)
    u = r.choices[0].uncertainty
    assert r.choices[0].text == "Maybe Lyon"
    assert u["g_nll"] == pytest.approx(g_nll(UNSURE[1]))
    assert u["ln_g_nll"] == pytest.approx(g_nll(UNSURE[1]) / 2)
    assert u["num_tokens"] == 2 and u["decoding"] == "greedy"
    assert u["token_logprobs"] == UNSURE[1] and u["tokens"] == UNSURE[0]
    assert r.choices[0].logprobs.token_logprobs == UNSURE[1]
    assert u["p_correct"] is None and u["abstain"] is None  # no policy configured

    chat = c.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": "capital of France?"}]
    )
    u = chat.choices[0].uncertainty
    assert chat.choices[0].message.content == "Paris."
    assert u["g_nll"] == pytest.approx(g_nll(SURE[1]))
    assert "token_logprobs" not in u and chat.choices[0].logprobs is None  # not asked for
    assert server.model.configs[-1].strategy == "greedy"  # temperature unset means greedy


def test_headers_carry_uncertainty(server):
    raw = client(server).chat.completions.with_raw_response.create(
        model="scripted", messages=[{"role": "user", "content": "unsure"}]
    )
    assert float(raw.headers["x-uncertainty-g-nll"]) == pytest.approx(5.0)
    assert raw.headers["x-uncertainty-tokens"] == "2"
    assert raw.headers["x-uncertainty-decoding"] == "greedy"


def test_chat_logprobs_in_openai_shape(server):
    chat = client(server).chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "unsure"}],
        logprobs=True,
        top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content
    assert [e.token for e in content] == UNSURE[0]
    assert [e.logprob for e in content] == UNSURE[1]


def test_sampling_is_not_reported_as_g_nll(server):
    r = client(server).completions.create(
        model="scripted", prompt="unsure", temperature=0.7, n=3, max_tokens=5
    )
    assert len(r.choices) == 3
    for ch in r.choices:
        assert ch.uncertainty["decoding"] == "sampled"
        assert ch.uncertainty["g_nll"] is None
        assert ch.uncertainty["nll"] == pytest.approx(5.0)
    cfg = server.model.configs[-1]
    assert cfg.strategy == "sample" and cfg.temperature == 0.7 and cfg.num_sequences == 3


@pytest.mark.parametrize("chat", [False, True])
def test_streaming_sends_uncertainty_in_final_chunk(server, chat):
    c = client(server)
    if chat:
        chunks = list(
            c.chat.completions.create(
                model="scripted", messages=[{"role": "user", "content": "unsure"}], stream=True
            )
        )
        pieces = [ch.choices[0].delta.content or "" for ch in chunks if ch.choices]
    else:
        chunks = list(c.completions.create(model="scripted", prompt="unsure", stream=True))
        pieces = [ch.choices[0].text for ch in chunks if ch.choices]
    assert "".join(pieces) == "Maybe Lyon"
    assert len([p for p in pieces if p]) == 2  # one piece per token
    finals = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "stop"
    assert finals[0].choices[0].uncertainty["g_nll"] == pytest.approx(5.0)
    assert all(
        getattr(ch.choices[0], "uncertainty", None) is None
        for ch in chunks
        if ch.choices and ch is not finals[0]
    )


def test_concurrent_requests_share_generate_calls(server):
    """16 clients at once: fewer generate calls than requests, and each gets its own answer."""
    server.model.delay = 0.3  # a batch decodes for a while; newcomers queue for the next one
    c = client(server)
    prompts = ["unsure" if i % 2 else f"q{i}" for i in range(16)]
    results: dict[int, str] = {}

    def one(i):
        r = c.completions.create(model="scripted", prompt=prompts[i])
        results[i] = r.choices[0].text

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(results[i] == ("Maybe Lyon" if i % 2 else "Paris.") for i in range(16))
    assert sum(server.model.calls) == 16
    assert len(server.model.calls) < 16 and max(server.model.calls) >= 4
    metrics = httpx.get(server.url + "/metrics").text
    assert "gnll_batch_prompts_count" in metrics


def test_different_configs_are_not_batched_together(server):
    server.model.delay = 0.2
    c = client(server)
    out = {}

    def one(i):
        r = c.completions.create(model="scripted", prompt=f"q{i}", max_tokens=5 + i % 2)
        out[i] = r

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    caps = {cfg.max_new_tokens for cfg in server.model.configs}
    assert caps == {5, 6} and len(out) == 6


@pytest.mark.parametrize("server", [{"api_key": KEY}], indirect=True)
def test_auth_on(server):
    with pytest.raises(openai.AuthenticationError):
        client(server, key="wrong").completions.create(model="scripted", prompt="x")
    r = client(server, key=KEY).completions.create(model="scripted", prompt="x")
    assert r.choices[0].text == "Paris."
    assert httpx.get(server.url + "/metrics").status_code == 401
    assert httpx.get(server.url + "/health").json()["auth"] is True  # health stays open


def test_auth_off_accepts_any_key(server):
    assert client(server, key="anything").models.list().data[0].id == "scripted"


@pytest.mark.parametrize("server", [{"max_request_bytes": 4096}], indirect=True)
def test_oversized_request_rejected(server):
    with pytest.raises(openai.APIStatusError) as err:
        client(server).completions.create(model="scripted", prompt="x" * 10_000)
    assert err.value.status_code == 413
    assert "4096 bytes" in err.value.message
    assert server.model.calls == []


@pytest.mark.parametrize(
    "server", [{"max_tokens_limit": 64, "default_max_tokens": 32}], indirect=True
)
def test_max_tokens_limit_and_bad_requests(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError, match="above this server's limit of 64"):
        c.completions.create(model="scripted", prompt="x", max_tokens=65)
    with pytest.raises(openai.BadRequestError, match="n > 1 needs temperature > 0"):
        c.completions.create(model="scripted", prompt="x", n=2)
    with pytest.raises(openai.BadRequestError, match="top_p"):
        c.completions.create(model="scripted", prompt="x", top_p=0.9)
    with pytest.raises(openai.NotFoundError, match="does not exist here") as err:
        c.completions.create(model="other-model", prompt="x")
    assert err.value.code == "model_not_found"
    r = httpx.post(server.url + "/v1/completions", content=b"{not json")
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    c.completions.create(model="scripted", prompt="x")
    assert server.model.configs[-1].max_new_tokens == 32
    assert len(server.model.calls) == 1  # the refused ones never reached the model


@pytest.mark.parametrize(
    "server", [{"policy": AbstentionPolicy(mode="annotate", threshold=1.0)}], indirect=True
)
def test_policy_annotate(server):
    c = client(server)
    sure = c.completions.create(model="scripted", prompt="sure")
    unsure = c.completions.create(model="scripted", prompt="unsure")
    assert sure.choices[0].uncertainty["abstain"] is False
    assert unsure.choices[0].uncertainty["abstain"] is True
    assert unsure.choices[0].text == "Maybe Lyon" and unsure.choices[0].finish_reason == "stop"
    metrics = httpx.get(server.url + "/metrics").text
    assert "gnll_abstention_rate 0.5" in metrics
    assert "gnll_abstentions_total 1.0" in metrics


@pytest.mark.parametrize(
    "server", [{"policy": AbstentionPolicy(mode="flag", threshold=1.0)}], indirect=True
)
def test_policy_flag(server):
    raw = client(server).chat.completions.with_raw_response.create(
        model="scripted", messages=[{"role": "user", "content": "unsure"}]
    )
    chat = raw.parse()
    assert chat.choices[0].finish_reason == "stop"  # OpenAI's enum; abstention is in uncertainty
    assert chat.choices[0].uncertainty["abstain"] is True
    assert chat.choices[0].message.content == "Maybe Lyon"
    assert raw.headers["x-uncertainty-abstain"] == "true"
    sure = client(server).chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": "sure"}]
    )
    assert sure.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "server",
    [{"policy": AbstentionPolicy(mode="refuse", threshold=1.0, refusal="I do not know.")}],
    indirect=True,
)
def test_policy_refuse(server):
    c = client(server)
    chat = c.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": "unsure"}], logprobs=True
    )
    ch = chat.choices[0]
    assert ch.message.content == "I do not know." and ch.finish_reason == "stop"
    assert ch.uncertainty["abstain"] is True and ch.uncertainty["refused"] is True
    assert "Maybe" not in chat.model_dump_json()  # the refused answer is not sent anywhere
    assert ch.logprobs is None  # they described the withheld text
    stream = c.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": "unsure"}], stream=True
    )
    assert (
        "".join(x.choices[0].delta.content or "" for x in stream if x.choices) == "I do not know."
    )
    sure = c.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "ok"}])
    assert sure.choices[0].message.content == "Paris."


def test_policy_needs_a_threshold_on_the_cli(tmp_path):
    from typer.testing import CliRunner

    from gnll.cli.main import app

    res = CliRunner().invoke(app, ["serve", "--policy", "refuse"])
    assert res.exit_code == 2 and "needs --calibration FILE or --threshold" in res.output


def _access_lines(srv, caplog, prompt):
    import logging

    logger = logging.getLogger("gnll.serve.access")
    was, logger.propagate = logger.propagate, True
    try:
        with caplog.at_level(logging.INFO, logger="gnll.serve.access"):
            client(srv).completions.create(model="scripted", prompt=prompt)
    finally:
        logger.propagate = was
    return [r.getMessage() for r in caplog.records if r.name == "gnll.serve.access"]


def test_access_log_has_no_prompt_text_by_default(server, caplog):
    lines = _access_lines(server, caplog, "secret question text")
    assert lines and '"g_nll"' in lines[-1] and '"status": 200' in lines[-1]
    assert "secret question text" not in "\n".join(lines)


@pytest.mark.parametrize("server", [{"log_prompts": True}], indirect=True)
def test_access_log_with_log_prompts(server, caplog):
    import json

    entry = json.loads(_access_lines(server, caplog, "unsure")[-1])
    assert entry["prompt"] == "unsure" and entry["answers"] == ["Maybe Lyon"]
    assert entry["g_nll"] == [pytest.approx(5.0)]


def test_upstream_down_is_502():
    from gnll.serving import create_app
    from gnll.serving.proxy import ProxyService

    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    app = create_app(ProxyService(dead, timeout=5), ServeSettings())
    with ServerThread(app) as srv:
        with pytest.raises(openai.APIStatusError) as err:
            client(srv).completions.create(model="m", prompt="x")
        assert err.value.status_code == 502
        assert "cannot reach the upstream server" in err.value.message


def test_calibration_file_gives_p_correct_and_abstain(tmp_path):
    """A `gnll calibrate` file: p_correct from its map, abstain from its fitted accuracy threshold."""
    import numpy as np

    from gnll.calibration import Calibrator

    rng = np.random.default_rng(0)
    g = rng.exponential(1.5, 2000)
    y = rng.uniform(size=2000) < np.exp(-g)  # P(correct) falls with G-NLL
    cal = Calibrator(target_accuracy=0.8, target_coverage=None).fit(g, y)
    cal.meta = {"measure": "g-nll", "model": "scripted"}
    path = cal.save(tmp_path / "calibration.json")
    policy = AbstentionPolicy.from_calibration(path, model="scripted", mode="flag")
    t = cal.thresholds_["accuracy"].threshold
    assert 0.0 < t < 5.0  # SURE's G-NLL (0.03) answers, UNSURE's (5.0) abstains
    with ServerThread(build_inprocess_app(ScriptedModel(), ServeSettings(policy=policy))) as srv:
        c = client(srv)
        sure = c.completions.create(model="scripted", prompt="sure").choices[0]
        unsure = c.completions.create(model="scripted", prompt="unsure").choices[0]
        health = httpx.get(srv.url + "/health").json()
    assert sure.uncertainty["p_correct"] == pytest.approx(cal.predict_proba([0.03])[0])
    assert unsure.uncertainty["p_correct"] == pytest.approx(cal.predict_proba([5.0])[0])
    assert sure.uncertainty["abstain"] is False and sure.finish_reason == "stop"
    assert unsure.uncertainty["abstain"] is True and unsure.finish_reason == "stop"
    assert health["policy"]["calibrated"] is True
    assert health["policy"]["source"].startswith("calibration.json (accuracy among answered >= 0.8")


def test_calibration_of_another_measure_is_refused(tmp_path):
    import numpy as np

    from gnll.calibration import Calibrator

    g = np.linspace(0, 5, 200)
    cal = Calibrator(target_coverage=None).fit(g, g < 2)
    cal.meta = {"measure": "pe"}
    path = cal.save(tmp_path / "pe.json")
    with pytest.raises(ValueError, match="needs a G-NLL calibration"):
        AbstentionPolicy.from_calibration(path)


def test_engine_keeps_staggered_clients_in_one_batch():
    """Clients that come back a few ms apart share a call, groups out of step merge again (adaptive
    wait), and a lone client never waits."""
    import asyncio
    import random
    import time

    from gnll.backends.base import GenerationConfig
    from gnll.serving.engine import BatchingEngine

    model = ScriptedModel(delay=0.8)
    # A 200 ms window (25% of a batch) covers the clients' think time and is plain to see below.
    engine = BatchingEngine(model, max_wait_ms=200, wait_fraction=0.25)
    cfg = GenerationConfig.greedy()
    rng = random.Random(0)

    async def client(rounds: int) -> None:
        for _ in range(rounds):
            await engine.submit(["q"], cfg)
            await asyncio.sleep(rng.uniform(0.0, 0.03))  # the client's own think time

    async def crowd() -> None:
        # One client starts alone, three join while its batch decodes: the groups must merge.
        first = asyncio.ensure_future(client(4))
        await asyncio.sleep(0.1)
        await asyncio.wait_for(asyncio.gather(first, *(client(4) for _ in range(3))), 60)

    async def lone() -> list[float]:
        out = []
        for _ in range(3):
            t = time.perf_counter()
            await engine.submit(["q"], cfg)
            out.append(time.perf_counter() - t)
        return out

    engine.start()
    try:
        asyncio.run(crowd())
        calls = list(model.calls)
        model.calls.clear()
        asyncio.run(client(1))  # the first lone request may wait once for the others...
        waits = asyncio.run(lone())  # ...then the previous batch had one prompt: no waiting
    finally:
        engine.stop()
    assert sum(calls) == 16
    # The lone starter's batch, then everyone together (the starter finishes one round early).
    assert calls == [1, 4, 4, 4, 3], calls
    assert max(waits) < 0.8 + 0.15, waits  # no 200 ms window


def test_shipped_calibration_auto():
    """`--calibration auto`: the file shipped for an embedded model; its rule is stated as fitted."""
    from gnll.calibration import load_calibration

    policy = AbstentionPolicy.from_calibration(
        "auto", model="smollm2-135m-instruct", rule="coverage"
    )
    cal = load_calibration("auto", model="smollm2-135m-instruct")
    p, abstain = policy.decide(2.0)
    assert p == pytest.approx(cal.predict_proba([2.0])[0])
    assert abstain == bool(cal.abstain([2.0], "coverage")[0])
    assert policy.source.startswith("smollm2-135m-instruct.json (shipped) (fraction answered >= ")
    with pytest.raises(FileNotFoundError, match="no shipped calibration"):
        AbstentionPolicy.from_calibration("auto", model="no-such-model")
