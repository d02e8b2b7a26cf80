"""`gnll serve --upstream` in front of a reasoning model's server: G-NLL of the answer only.

The upstream is a stand-in that replays CONSTRUCTED responses in vLLM's and llama.cpp's exact
shapes (tests/fixtures/reasoning/). Before the splitter, the proxy reported ``g_nll: 2.2`` for the
vLLM response: the NLL of the first four *trace* tokens, cut at the answer text's length.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from serve_helpers import ScriptedModel
from standin import StandIn

from gnll.backends.base import Generation
from gnll.serving import ServeSettings, create_app
from gnll.serving.proxy import ProxyService
from gnll.serving.server import ServerThread

FIX = Path(__file__).parents[1] / "fixtures" / "reasoning"
MSG = [{"role": "user", "content": "What is 2+2?"}]


def responder(body_file: str, owner: str = "vllm"):
    payload = (FIX / body_file).read_bytes()

    def respond(method, path, body):
        if path.endswith("/models"):
            return 200, {"object": "list", "data": [{"id": "r1", "owned_by": owner}]}
        return 200, payload

    return respond


def via_proxy(body_file: str, owner: str = "vllm", **kw):
    up = StandIn(responder(body_file, owner))  # bound now, serving once entered
    srv = ServerThread(create_app(ProxyService(up.url, timeout=30, **kw), ServeSettings()))
    return up, srv


def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)


@pytest.mark.parametrize(
    "fixture,owner", [("vllm_chat.json", "vllm"), ("llamacpp_chat.json", "llamacpp")]
)
def test_proxy_scores_the_answer_not_the_trace(fixture, owner):
    up, srv = via_proxy(fixture, owner)
    with up, srv:
        r = client(srv).chat.completions.create(model="r1", messages=MSG)
    u = r.choices[0].uncertainty
    assert r.choices[0].message.content == "The answer is 4."
    assert u["g_nll"] == pytest.approx(0.15)  # was 2.2: the first four trace tokens
    assert u["num_tokens"] == 2 and u["scored"] == "answer"
    assert u["trace_nll"] == pytest.approx(3.81) and u["trace_tokens"] == 8
    assert (u["marker_tokens"], u["answer_tokens"], u["split_at"]) == (1, 2, 9)
    # DeepConf's trace confidence beside it, from the one reported alternative per position
    tc = u["trace_confidence"]
    assert tc["k"] == 1 and tc["tail"] == pytest.approx(3.81 / 8) == tc["lowest_group"]
    # the span over the answer carries the answer's NLL, not the trace's
    assert all(s["nll"] <= 0.15 + 1e-9 for s in u.get("spans") or [])
    body = up.requests[-1][2]
    assert body["logprobs"] is True


def test_proxy_stream_vllm_labels_tokens_by_delta():
    up, srv = via_proxy("vllm_chat_stream.sse")
    with up, srv:
        chunks = list(client(srv).chat.completions.create(model="r1", messages=MSG, stream=True))
    last = chunks[-1].choices[0]
    u = last.uncertainty
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The answer is 4."
    assert u["g_nll"] == pytest.approx(0.15) and u["reasoning_source"] == "stream"
    assert (u["trace_tokens"], u["marker_tokens"], u["answer_tokens"]) == (8, 1, 2)


def test_proxy_stream_llamacpp_without_the_marker_is_an_error_not_a_number():
    up, srv = via_proxy("llamacpp_chat_stream.sse", "llamacpp")
    with up, srv:
        stream = client(srv).chat.completions.create(model="r1", messages=MSG, stream=True)
        with pytest.raises(openai.APIError) as err:
            for chunk in stream:
                assert not getattr(chunk.choices[0], "uncertainty", None) if chunk.choices else True
    assert "no token for the end-of-reasoning marker" in str(err.value)
    assert '"stream": false' in str(err.value)


def test_proxy_refuses_reasoning_without_alignable_logprobs():
    up, srv = via_proxy("vllm_chat_no_marker.json")
    with up, srv, pytest.raises(openai.APIStatusError) as err:
        client(srv).chat.completions.create(model="r1", messages=MSG)
    assert err.value.status_code == 502
    assert "cannot be aligned" in err.value.message and "\n" not in err.value.message


def test_proxy_splits_for_an_upstream_without_a_reasoning_parser():
    data = json.loads((FIX / "vllm_chat.json").read_text())
    msg = data["choices"][0]["message"]
    msg["content"] = msg.pop("reasoning") + "</think>" + msg["content"]

    def respond(method, path, body):
        if path.endswith("/models"):
            return 200, {"object": "list", "data": [{"id": "r1", "owned_by": "vllm"}]}
        return 200, json.loads(json.dumps(data))

    with (
        StandIn(respond) as up,
        ServerThread(create_app(ProxyService(up.url, reasoning="think"), ServeSettings())) as srv,
    ):
        r = client(srv).chat.completions.create(model="r1", messages=MSG)
    assert r.choices[0].message.content == "The answer is 4."
    assert r.choices[0].message.reasoning == "Okay, two plus two is four."
    assert r.choices[0].uncertainty["g_nll"] == pytest.approx(0.15)


def test_non_reasoning_answers_carry_no_reasoning_fields():
    up, srv = via_proxy("../vllm/chat_stop.json")
    with up, srv:
        r = client(srv).chat.completions.create(model="r1", messages=MSG)
    u = r.choices[0].uncertainty
    assert not {"scored", "trace_nll", "split_at"} & set(u)


def test_early_refusal_counts_the_answer_not_the_trace():
    """--policy refuse decides early on released tokens: a reasoning model's trace (NLL 3.81) is
    context, so a threshold of 1.0 keeps the answer (NLL 0.15); counting the trace would refuse."""
    from gnll.serving import AbstentionPolicy

    up = StandIn(responder("vllm_chat_stream.sse"))
    policy = AbstentionPolicy(mode="refuse", threshold=1.0)
    settings = ServeSettings(policy=policy, early=True)  # the proxy decides early when asked
    srv = ServerThread(create_app(ProxyService(up.url, timeout=30), settings))
    with up, srv:
        r = client(srv).chat.completions.create(model="r1", messages=MSG)
    u = r.choices[0].uncertainty
    assert r.choices[0].message.content == "The answer is 4."
    assert not u.get("refused") and u["abstain"] is False
    assert u["g_nll"] == pytest.approx(0.15) and u["trace_tokens"] == 8
    assert up.requests[-1][2]["stream"] is True  # the proxy watched the stream


class Reasoner(ScriptedModel):
    """Thinks "Let me think." (NLL 2.5), writes </think> (0.3), answers "Paris." (0.03)."""

    def generate(self, prompts, config=None, **kwargs):
        if config is not None and "</think>" in config.stop:
            trace = Generation(
                "Let me think.",
                [1, 2],
                ["Let me", " think."],
                [-1.0, -1.5],
                "stop",
                stop_sequence="</think>",
                terminator_token_ids=[3],
                terminator_logprobs=[-0.3],
            )
            return [[trace] for _ in prompts]
        return super().generate(prompts, config, **kwargs)


def test_in_process_reasoning_model_and_a_proxy_in_front_report_the_answers_g_nll():
    from gnll.backends.reasoning_model import ReasoningModel
    from gnll.serving import build_inprocess_app

    model = ReasoningModel(Reasoner(), "think")
    app = build_inprocess_app(model, ServeSettings(), max_wait_ms=1)
    with ServerThread(app) as upstream:
        direct = client(upstream).chat.completions.create(model="scripted", messages=MSG)
        with ServerThread(create_app(ProxyService(upstream.url + "/v1"), ServeSettings())) as px:
            via = client(px).chat.completions.create(model="scripted", messages=MSG)
    for r in (direct, via):
        assert r.choices[0].message.content == "Paris."
        assert r.choices[0].message.reasoning == "Let me think."
        assert r.choices[0].uncertainty["g_nll"] == pytest.approx(0.03)
        assert r.choices[0].uncertainty["scored"] == "answer"
    u = direct.choices[0].uncertainty
    assert u["trace_nll"] == pytest.approx(2.5) and u["reasoning_source"] == "generated"
    assert (u["trace_tokens"], u["marker_tokens"], u["answer_tokens"]) == (2, 1, 2)
    # the server's log-probs cover the answer only: the proxy says so
    v = via.choices[0].uncertainty
    assert v["reasoning_source"] == "answer-only"
    assert "trace_nll" not in v and "trace_tokens" not in v  # unknown there, not 0
    # the answer was decoded after prompt + <think> + trace + </think>
    assert model.model.prompts[-1].endswith("<think>\nLet me think.\n</think>\n\n")
