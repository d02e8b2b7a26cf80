"""`gnll serve --upstream SMALL --policy escalate --escalate-to LARGE`: the small server answers; an
answer the policy escalates is cut at its exact early decision (the proxy closes the small
server's stream there) and the large server's request starts at that moment.

The two stand-in OpenAI servers are those of tests/escalate_standins.py.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from escalate_standins import LargeUpstream, SmallUpstream, cascade
from serve_helpers import escalating

from gnll._util.validation import ParameterError
from gnll.serving import AbstentionPolicy, ServeSettings, build_proxy_app, check_escalation
from gnll.serving.server import ServerThread


@pytest.fixture
def upstreams():
    with SmallUpstream(tokens=40, pause=0.03) as small, LargeUpstream() as large:
        yield small, large


@pytest.fixture
def slow_upstreams():
    """A small upstream 0.25 s between tokens: time enough (even on a loaded machine) for the
    proxy to decide and disconnect before the next token."""
    with SmallUpstream(tokens=40, pause=0.25) as small, LargeUpstream() as large:
        yield small, large


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_the_small_stream_is_cut_at_the_decision_and_the_large_request_starts_there(
    slow_upstreams, chat
):
    small, large = slow_upstreams
    path, kw = (
        ("/chat/completions", {"messages": [{"role": "user", "content": "q"}]})
        if chat
        else (
            "/completions",
            {"prompt": "q"},
        )
    )
    with cascade(small, large) as px:
        r = httpx.post(px.url + "/v1" + path, json={"max_tokens": 40, **kw}, timeout=60)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    u = choice["uncertainty"]
    assert (choice["message"]["content"] if chat else choice["text"]) == " Paris."
    assert u["answered_by"] == "large" and u["escalated"] is True and r.headers["x-answered-by"]
    assert u["g_nll"] == pytest.approx(0.3)  # the large answer's own
    assert r.json()["usage"]["completion_tokens"] == 2  # the large upstream's count
    local = u["local"]
    # 7 tokens of NLL 0.5 pass 3.0: the decision is exact there.
    assert local["early"] is True and local["decided_at_token"] == 7
    assert local["g_nll"] == 3.5 and local["g_nll_is_lower_bound"] is True
    assert local["text"] == "".join(f" w{i}" for i in range(7)) and local["model"] == "small"
    assert local["tokens_generated"] == 7 and local["tokens_saved"] == 40 - 7
    # The small upstream saw the disconnect right after its 7th token (between the 7th and the
    # 8th, 0.25 s apart), long before its 40 tokens.
    assert small.done.wait(10)
    assert small.disconnected == [True] and small.sent == [7]
    # The large request started at the disconnect, before the small answer would have ended.
    (arrived,) = large.arrived
    assert arrived < small.started[0] + 40 * small.pause
    assert small.started[0] + 6 * small.pause <= arrived  # not before the 7th token was sent
    assert arrived - small.ended[0] < 0.5  # within moments of the disconnect
    assert large.bodies[0]["model"] == "large"


def test_the_early_decision_equals_the_wait_for_the_end_decision(upstreams):
    small, large = upstreams
    outcomes = {}
    for early in (True, False):
        for threshold in (3.0, 100.0):  # escalated (G-NLL 20 at the end), kept
            with cascade(small, large, threshold, early=early) as px:
                r = httpx.post(
                    px.url + "/v1/completions", json={"prompt": "q", "max_tokens": 40}, timeout=60
                )
            u = r.json()["choices"][0]["uncertainty"]
            outcomes[early, threshold] = (u["escalated"], u["answered_by"])
            if not early:
                assert "early" not in u.get("local", u)
            if not u["escalated"]:
                assert u["g_nll"] == 20.0 and r.json()["usage"]["completion_tokens"] == 40
    assert outcomes[True, 3.0] == outcomes[False, 3.0] == (True, "large")
    assert outcomes[True, 100.0] == outcomes[False, 100.0] == (False, "small")
    # Early: one stream cut at 7, one read to its end; waiting: two whole answers.
    assert small.sent == [7, 40, 40, 40] and small.disconnected == [True, False, False, False]


def _decoded_at_first_piece(px: ServerThread, small: SmallUpstream, **body: Any) -> tuple[int, str]:
    """How many tokens ``small`` had decoded for this request when the client got the first piece
    of the answer, and the answer's text."""
    client = openai.OpenAI(base_url=px.url + "/v1", api_key="x", max_retries=0, timeout=60)
    before = small.decoded
    decoded, pieces = None, []
    for chunk in client.chat.completions.create(
        model="small", messages=[{"role": "user", "content": "q"}], stream=True, **body
    ):
        piece = chunk.choices[0].delta.content if chunk.choices else None
        if piece and decoded is None:
            decoded = small.decoded - before
        pieces.append(piece or "")
    assert decoded is not None
    return decoded, "".join(pieces)


def test_the_client_gets_the_escalated_answer_sooner_with_early_decisions():
    """Counted in the small model's tokens, not in seconds: with early decisions the client's first
    piece of the escalated answer comes after the 7 tokens of the decision, without them after the
    whole 40-token answer."""
    decoded = {}
    with SmallUpstream(tokens=40, pause=0.05) as small, LargeUpstream() as large:
        for early in (True, False):
            with cascade(small, large, early=early) as px:
                decoded[early], text = _decoded_at_first_piece(px, small, max_tokens=40)
            assert text == " Paris."
    assert decoded == {True: 7, False: 40}
    assert small.sent == [7, 40]


def test_early_is_the_default_for_an_upstream_that_streams_its_usage(upstreams):
    small, large = upstreams
    with cascade(small, large, server="vllm") as px:  # vLLM sends usage in streams
        u = httpx.post(
            px.url + "/v1/completions", json={"prompt": "q", "max_tokens": 40}, timeout=60
        ).json()["choices"][0]["uncertainty"]
    assert u["local"]["early"] is True and small.sent == [7]
    # llama-cpp-python sends none: a kept answer read from a stream would have no usage, so there
    # the proxy waits for the whole answer unless --early asks.
    with cascade(small, large, server="llama-cpp-python") as px:
        u = httpx.post(
            px.url + "/v1/completions", json={"prompt": "q", "max_tokens": 40}, timeout=60
        ).json()["choices"][0]["uncertainty"]
    assert "early" not in u["local"] and u["local"]["g_nll"] == 20.0
    with cascade(small, large, server="llama-cpp-python", early=True) as px:
        u = httpx.post(
            px.url + "/v1/completions", json={"prompt": "q", "max_tokens": 40}, timeout=60
        ).json()["choices"][0]["uncertainty"]
    assert u["local"]["early"] is True
    assert small.sent == [7, 40, 7]


def test_metrics_count_the_early_escalation_and_the_tokens_saved(upstreams):
    small, large = upstreams
    with cascade(small, large) as px:
        httpx.post(px.url + "/v1/completions", json={"prompt": "q", "max_tokens": 40}, timeout=60)
        metrics = httpx.get(px.url + "/metrics").text
    assert 'gnll_early_decisions_total{action="escalate"} 1.0' in metrics
    assert "gnll_early_tokens_saved_total 33.0" in metrics
    assert 'gnll_escalations_total{outcome="answered"} 1.0' in metrics


def test_a_failed_escalation_returns_the_small_answer_so_far(upstreams):
    small, large = upstreams
    large.close()  # nobody listens there any more
    with cascade(small, large) as px:
        r = httpx.post(
            px.url + "/v1/completions", json={"prompt": "q", "max_tokens": 40}, timeout=60
        )
    c = r.json()["choices"][0]
    assert r.status_code == 200 and c["text"] == "".join(f" w{i}" for i in range(7))
    u = c["uncertainty"]
    assert u["escalated"] is False and u["answered_by"] == "small"
    assert "cannot reach" in u["escalation_error"] and u["early"] is True


def test_the_record_has_the_in_process_escalations_shape(upstreams):
    from serve_helpers import ScriptedModel, StreamingModel

    small, large = upstreams
    with cascade(small, large) as px:
        proxied = httpx.post(
            px.url + "/v1/completions", json={"prompt": "q", "max_tokens": 40}, timeout=60
        ).json()["choices"][0]["uncertainty"]
    settings = ServeSettings(policy=AbstentionPolicy(mode="escalate", threshold=2.0))
    with escalating(StreamingModel(), ScriptedModel(), settings) as s:
        local = httpx.post(
            s.url + "/v1/completions", json={"prompt": "long", "max_tokens": 40}, timeout=60
        ).json()["choices"][0]["uncertainty"]
    assert local["escalated"] is True and local["local"]["early"] is True
    assert set(proxied) == set(local)
    # The in-process record says which prompt format it measured; an upstream's does not know.
    assert set(proxied["local"]) ^ set(local["local"]) <= {"prompt_format"}


def test_proxy_escalation_rules():
    escalate = ServeSettings(policy=AbstentionPolicy(mode="escalate", threshold=1.0))
    check_escalation(escalate, "http://127.0.0.1:9/v1", upstream="http://127.0.0.1:8/v1")
    with pytest.raises(ParameterError, match="^escalate_to is the upstream itself") as err:
        check_escalation(escalate, "http://127.0.0.1:9/v1/", upstream="http://127.0.0.1:9/v1")
    assert "\n" not in str(err.value)
    with pytest.raises(ParameterError, match="escalate_to is needed by mode 'escalate'"):
        build_proxy_app("http://127.0.0.1:9/v1", escalate)
    with pytest.raises(ParameterError, match="escalate_to needs mode 'escalate'"):
        build_proxy_app("http://127.0.0.1:9/v1", ServeSettings(), escalate_to="http://x:1/v1")


def test_the_cli_serves_proxy_escalation(monkeypatch):
    """``gnll serve --upstream SMALL --policy escalate --escalate-to LARGE`` builds the cascade of
    two upstreams and says so (the early default depends on the upstream, found at start)."""
    from typer.testing import CliRunner

    import gnll.serving.server as server
    from gnll.cli.main import app
    from gnll.serving.cascade import CascadeService

    served = {}
    monkeypatch.setattr(server, "listen", lambda host, port: None)
    # (the server's logging set-up would take the access log away from later tests' caplog)
    monkeypatch.setattr(server, "configure_logging", lambda *a, **k: None)
    monkeypatch.setattr(
        server, "serve_forever", lambda application, *a, **k: served.update(app=application)
    )
    args = ["serve", "--upstream", "http://127.0.0.1:8/v1", "--policy", "escalate"]
    args += ["--threshold", "2", "--escalate-to", "http://127.0.0.1:9/v1"]
    res = CliRunner().invoke(app, [*args, "--escalate-model", "large"])
    assert res.exit_code == 0, res.output
    assert "proxy to http://127.0.0.1:8/v1, escalating to http://127.0.0.1:9/v1" in res.output
    assert "early decisions if the upstream sends usage in streams" in res.output
    service = served["app"].state.service
    assert isinstance(service, CascadeService) and service.upstream_model == "large"
    assert service.local.upstream == "http://127.0.0.1:8/v1"
    assert service.upstream.upstream == "http://127.0.0.1:9/v1"
    res = CliRunner().invoke(app, [*args, "--early"])
    assert res.exit_code == 0 and "; early decisions)" in res.output, res.output


def test_otel_events_say_where_the_proxy_decided(upstreams, otel):
    from gnll.serving.tracing import Emitter

    small, large = upstreams
    exp, provider = otel
    with cascade(small, large, tracing=Emitter(provider)) as px:
        httpx.post(px.url + "/v1/completions", json={"prompt": "q", "max_tokens": 40}, timeout=60)
    attrs = [dict(getattr(e, "log_record", e).attributes) for e in exp.get_finished_logs()]
    early = [a for a in attrs if "gnll.early_decision.token" in a]
    assert early and {a["gnll.early_decision.token"] for a in early} == {7}
    assert {a["gnll.early_decision.tokens_saved"] for a in early} == {33}
    assert {a["gen_ai.response.model"] for a in early} == {"large"}
