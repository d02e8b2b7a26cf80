"""`gnll serve`: `uncertainty.spans`, and `--policy escalate` to a larger upstream model.

Two real servers on loopback: the local one around the scripted stand-in model, and an "upstream"
gnll server around another stand-in (``big``) that answers differently, so who answered is visible.
"""

from __future__ import annotations

import math

import httpx
import openai
import pytest
from serve_helpers import SCRIPT, SURE, UNSURE, ScriptedModel

from gnll.backends.base import Generation
from gnll.serving import AbstentionPolicy, ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread, free_port

BIG = (["Lyon", "."], [-0.5, -0.25])


class BigModel(ScriptedModel):
    name = "big"

    def generate(self, prompts, config=None, **kwargs):
        self.calls.append(len(prompts))
        return [[Generation("Lyon.", [7, 8], *map(list, BIG), "eos")] for _ in prompts]


def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=30)


@pytest.fixture
def upstream():
    with ServerThread(build_inprocess_app(BigModel(), ServeSettings(), max_wait_ms=5)) as srv:
        yield srv


def local_server(escalate_to: str, threshold: float = 1.0):
    settings = ServeSettings(policy=AbstentionPolicy(mode="escalate", threshold=threshold))
    model = ScriptedModel()
    app = build_inprocess_app(
        model, settings, max_wait_ms=5, escalate_to=escalate_to, escalate_model="big"
    )
    return ServerThread(app), model


def test_sure_answer_stays_local_unsure_one_escalates(upstream):
    srv, _ = local_server(upstream.url + "/v1")
    with srv:
        c = client(srv)
        sure = c.chat.completions.with_raw_response.create(
            model="scripted", messages=[{"role": "user", "content": "capital?"}]
        )
        assert sure.headers["x-answered-by"] == "scripted"
        ch = sure.parse().choices[0]
        assert ch.message.content == "Paris." and ch.uncertainty["escalated"] is False
        assert ch.uncertainty["g_nll"] == pytest.approx(-math.fsum(SURE[1]))

        raw = c.chat.completions.with_raw_response.create(
            model="scripted", messages=[{"role": "user", "content": "unsure"}]
        )
        assert raw.headers["x-answered-by"] == "big"
        ch = raw.parse().choices[0]
        u = ch.uncertainty
        assert ch.message.content == "Lyon." and u["escalated"] is True
        assert u["answered_by"] == "big"
        assert u["g_nll"] == pytest.approx(0.75)  # the upstream answer's own G-NLL
        assert u["local"]["g_nll"] == pytest.approx(5.0) and u["local"]["abstain"] is True
        assert u["local"]["text"] == "Maybe Lyon" and u["local"]["model"] == "scripted"

        # streamed: held until the local G-NLL is known, then the upstream answer is replayed
        chunks = list(
            c.chat.completions.create(
                model="scripted", messages=[{"role": "user", "content": "unsure"}], stream=True
            )
        )
        text = "".join(x.choices[0].delta.content or "" for x in chunks if x.choices)
        final = [x for x in chunks if x.choices and x.choices[0].finish_reason][0]
        assert text == "Lyon." and final.choices[0].uncertainty["answered_by"] == "big"
        r = c.completions.create(model="scripted", prompt="unsure", stream=True)
        assert "".join(x.choices[0].text for x in r if x.choices) == "Lyon."
        metrics = httpx.get(srv.url + "/metrics").text
        assert 'gnll_escalations_total{outcome="answered"} 3.0' in metrics


def test_upstream_down_returns_the_local_answer_flagged():
    srv, _ = local_server(f"http://127.0.0.1:{free_port()}/v1")
    with srv:
        ch = (
            client(srv)
            .chat.completions.create(
                model="scripted", messages=[{"role": "user", "content": "unsure"}]
            )
            .choices[0]
        )
        assert ch.message.content == "Maybe Lyon"
        assert ch.uncertainty["answered_by"] == "scripted"
        assert "cannot reach" in ch.uncertainty["escalation_error"]
        metrics = httpx.get(srv.url + "/metrics").text
        assert 'gnll_escalations_total{outcome="failed"} 1.0' in metrics
        health = httpx.get(srv.url + "/health")
        assert health.status_code == 200, health.text  # the local model still answers
        assert health.json()["escalate_to"]["ok"] is False


def test_escalate_needs_its_url_on_the_cli():
    from typer.testing import CliRunner

    from gnll.cli.main import app

    res = CliRunner().invoke(app, ["serve", "--policy", "escalate", "--threshold", "1"])
    assert res.exit_code == 2 and "--escalate-to" in res.output


def test_spans_in_every_answer(monkeypatch):
    two = (["It", " is", " Paris", ".", " Or", " Lyon", "?"], [-0.1, -0.1, -0.2, -0.1, -2, -3, -1])
    js = (['{"', "city", '":', ' "', "Par", "is", '"}'], [-0.1, -0.1, -0.1, -0.2, -1.5, -0.5, -0.1])
    monkeypatch.setitem(SCRIPT, "two", two)
    monkeypatch.setitem(SCRIPT, "json", js)
    with ServerThread(build_inprocess_app(ScriptedModel(), ServeSettings(), max_wait_ms=5)) as srv:
        c = client(srv)
        u = c.completions.create(model="scripted", prompt="two").choices[0].uncertainty
        assert u["spans_kind"] == "sentence"
        assert [(s["text"], s["start"], s["end"], s["num_tokens"]) for s in u["spans"]] == [
            ("It is Paris.", 0, 12, 4),
            ("Or Lyon?", 13, 21, 3),
        ]
        assert [s["nll"] for s in u["spans"]] == pytest.approx([0.5, 6.0])
        # the path of the least certain span, as gnll ask and gnll score name it
        assert u["least_certain_span"] == "2"
        assert [s["straddling"] for s in u["spans"]] == [0, 0]
        assert sum(s["nll"] for s in u["spans"]) == pytest.approx(u["g_nll"], abs=1e-9)  # same path: float64 sums of the same log-probs
        u = c.completions.create(model="scripted", prompt="json").choices[0].uncertainty
        assert u["spans_kind"] == "json"
        assert [(s["path"], s["text"], s["nll"]) for s in u["spans"]] == [("$.city", "Paris", 2.0)]
        # streamed answers carry them too, on the last chunk
        chunks = list(c.completions.create(model="scripted", prompt="two", stream=True))
        final = [x for x in chunks if x.choices and x.choices[0].finish_reason][0]
        assert len(final.choices[0].uncertainty["spans"]) == 2
        health = httpx.get(srv.url + "/health").json()
        assert health["status"] == "ok"


def test_sampled_answers_under_escalate_stream_live_and_never_escalate(upstream):
    srv, model = local_server(upstream.url + "/v1", threshold=0.0)
    with srv:
        r = client(srv).completions.create(
            model="scripted", prompt="unsure", temperature=0.7, max_tokens=5
        )
        assert r.choices[0].text == "Maybe Lyon"
        assert r.choices[0].uncertainty["g_nll"] is None


assert UNSURE  # the scripted model's uncertain answer, "Maybe Lyon" (G-NLL 5.0)


def test_calibrated_p_correct_gates_escalation(upstream):
    """With a calibration, the local answer is escalated when its p_correct is below
    --min_p_correct (the scripted sure answer has G-NLL 0.03, the unsure one 5.0)."""
    import numpy as np

    from gnll.calibration import Calibrator

    rng = np.random.default_rng(0)
    g = rng.exponential(2.0, 2000)
    cal = Calibrator(method="platt").fit(g, rng.uniform(size=2000) < np.exp(-g / 2))
    policy = AbstentionPolicy(mode="escalate", calibrator=cal, min_p_correct=0.5)
    app = build_inprocess_app(
        ScriptedModel(),
        ServeSettings(policy=policy),
        max_wait_ms=5,
        escalate_to=upstream.url + "/v1",
    )
    with ServerThread(app) as srv:
        c = client(srv)
        for prompt, who in (("capital?", "scripted"), ("unsure", "big")):
            u = c.completions.create(model="scripted", prompt=prompt).choices[0].uncertainty
            assert u["answered_by"] == who
            p = u["p_correct"] if who == "scripted" else u["local"]["p_correct"]
            assert (p < 0.5) == (who == "big")
