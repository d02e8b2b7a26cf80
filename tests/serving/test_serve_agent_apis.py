"""`/v1/responses` and `/v1/messages` speak the OpenAI Responses and Anthropic Messages APIs as the
official SDKs type them, with the answer's uncertainty, under every policy and in every mode.

The conformance matrix (API x stream or not x policy x mode) reuses the chat conformance servers
(:mod:`test_serve_conformance`): in-process with a decoding loop (live streams) and without
(replays), and the proxy, under annotate, flag, refuse and escalate. Every body is validated with
the SDK's own pydantic model (``openai.types.responses.Response``, ``anthropic.types.Message``) and
every stream event with the SDK's event union; the answer, its G-NLL and its decision are those of
chat for the same question; refuse leaks no byte of the refused answer.
"""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import openai
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.chat import ChatCompletion
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from serve_helpers import THOUGHTS, UNSURE, StreamingModel, Thinker, access_log
from test_serve_conformance import policed_server, server  # noqa: F401 (fixtures)

from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.serving import AbstentionPolicy, ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread

RESPONSE_EVENT = TypeAdapter(ResponseStreamEvent)
MESSAGE_EVENT = TypeAdapter(RawMessageStreamEvent)
APIS = ("responses", "messages")
REFUSAL = "I do not know."
THOUGHTS_TEXT = THOUGHTS[0]


def named_events(text: str) -> list[tuple[str, dict]]:
    """``(event name, data)`` of a server-sent-event body whose events are named."""
    out = []
    for block in text.split("\n\n"):
        lines = block.strip().splitlines()
        if not lines:
            continue
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        data = json.loads(lines[1][6:])
        assert data["type"] == lines[0][7:], block  # the name is the data's type
        out.append((lines[0][7:], data))
    return out


def request(api: str, model: str, prompt: str, **extra) -> tuple[str, dict]:
    if api == "responses":
        return "/v1/responses", {"model": model, "input": prompt, **extra}
    messages = [{"role": "user", "content": prompt}]
    return "/v1/messages", {"model": model, "max_tokens": 16, "messages": messages, **extra}


def post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=30)


def body_answer(api: str, body: dict) -> tuple[str, list[dict]]:
    """The answer text of a body validated with the SDK's type, and the records it carries (one
    per output item of a response, the message's own)."""
    if api == "responses":
        resp = Response.model_validate(body)
        assert resp.status in ("completed", "incomplete")
        assert all(item.status in ("completed", "incomplete") for item in resp.output)
        return resp.output_text, [item.uncertainty for item in resp.output]
    msg = Message.model_validate(body)
    assert msg.stop_reason in ("end_turn", "max_tokens", "tool_use")
    return "".join(b.text for b in msg.content if b.type == "text"), [msg.uncertainty]


def stream_answer(api: str, text: str) -> tuple[str, list[dict], dict]:
    """The text, the records and the final object of a stream, every event validated."""
    events = named_events(text)
    for _, data in events:
        assert data["type"] != "error", data
        (RESPONSE_EVENT if api == "responses" else MESSAGE_EVENT).validate_python(data)
    kinds = [k for k, _ in events]
    if api == "responses":
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert kinds[-1] in ("response.completed", "response.incomplete")
        assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
        pieces = "".join(d["delta"] for k, d in events if k == "response.output_text.delta")
        done = [d["item"] for k, d in events if k == "response.output_item.done"]
        final = events[-1][1]["response"]
        assert [i["id"] for i in final["output"]] == [i["id"] for i in done]
        return pieces, [i["uncertainty"] for i in done], final
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    pieces = "".join(d["delta"].get("text", "") for k, d in events if k == "content_block_delta")
    delta = events[-2][1]
    return pieces, [delta["uncertainty"]], delta


def chat(srv, prompt: str) -> dict:
    r = httpx.post(
        srv.url + "/v1/chat/completions",
        json={"model": srv.model_id, "messages": [{"role": "user", "content": prompt}]},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    ChatCompletion.model_validate(r.json())
    return r.json()["choices"][0]


@pytest.mark.parametrize("prompt", ["unsure", "sure"])
@pytest.mark.parametrize("api", APIS)
def test_every_policy_answers_as_the_sdks_type_it(policed_server, api, prompt):  # noqa: F811
    """Body and stream of each API validate with the SDK's types; text, G-NLL and decision equal
    chat's for the same question; under refuse no byte of the refused answer is sent."""
    srv = policed_server
    reference = chat(srv, prompt)
    ref = reference["uncertainty"]
    path, body = request(api, srv.model_id, prompt)
    r = post(srv, path, body)
    assert r.status_code == 200, r.text
    assert r.headers["x-gnll-served-via"] == "chat.completions"
    text, records = body_answer(api, r.json())
    assert text == reference["message"]["content"]
    assert records and all(rec is not None for rec in records)
    for rec in records:
        assert rec["g_nll"] == pytest.approx(ref["g_nll"], abs=BATCH_INVARIANCE_ATOL)
        assert rec["abstain"] == ref["abstain"] and rec.get("refused") == ref.get("refused")
    assert float(r.headers["x-uncertainty-g-nll"]) == pytest.approx(ref["g_nll"], abs=1e-4)
    s = post(srv, path, {**body, "stream": True})
    assert s.status_code == 200, s.text
    pieces, streamed, final = stream_answer(api, s.text)
    assert pieces == text
    for rec in streamed:
        assert rec["g_nll"] == pytest.approx(ref["g_nll"], abs=BATCH_INVARIANCE_ATOL)
        assert rec["abstain"] == ref["abstain"]
    if api == "messages":
        assert final["usage"]["output_tokens"] >= 0
    if srv.policy == "refuse" and prompt == "unsure":
        assert text == REFUSAL and records[0]["refused"] is True
        for raw in (r.text, s.text):  # the withheld answer is "Maybe Lyon"
            assert "Maybe" not in raw and "Lyon" not in raw


def test_the_sdks_create_and_stream_sync_and_async(server):  # noqa: F811
    """``client.responses.create`` / ``.stream`` and the anthropic SDK's ``messages.create`` /
    ``.stream``, sync and async, unchanged, with the record readable from the SDK objects."""
    srv = server
    expected = "".join(UNSURE[0])
    oc = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=30)
    r = oc.responses.create(
        model=srv.model_id, input="unsure", include=["message.output_text.logprobs"]
    )
    assert r.output_text == expected and r.output[0].uncertainty["g_nll"] == pytest.approx(5.0)
    assert [t.logprob for t in r.output[0].content[0].logprobs] == UNSURE[1]
    with oc.responses.stream(model=srv.model_id, input="unsure") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == expected
    assert final.output[0].uncertainty["g_nll"] == pytest.approx(5.0)

    ac = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0, timeout=30)
    user = [{"role": "user", "content": "unsure"}]
    m = ac.messages.create(model=srv.model_id, max_tokens=16, messages=user)
    assert m.content[0].text == expected and m.uncertainty["g_nll"] == pytest.approx(5.0)
    assert m.stop_reason == "end_turn" and m.usage.output_tokens > 0
    with ac.messages.stream(model=srv.model_id, max_tokens=16, messages=user) as stream:
        records = [e.uncertainty for e in stream if e.type == "message_delta"]
        texts = "".join(stream.get_final_message().content[0].text)
    assert texts == expected and records[0]["g_nll"] == pytest.approx(5.0)

    async def both_async() -> tuple[str, str]:
        aoc = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        aac = anthropic.AsyncAnthropic(base_url=srv.url, api_key="x", max_retries=0)
        r = await aoc.responses.create(model=srv.model_id, input="unsure")
        async with aoc.responses.stream(model=srv.model_id, input="unsure") as stream:
            async for _ in stream:
                pass
            streamed = (await stream.get_final_response()).output_text
        m = await aac.messages.create(model=srv.model_id, max_tokens=16, messages=user)
        async with aac.messages.stream(model=srv.model_id, max_tokens=16, messages=user) as s:
            text = await s.get_final_text()
        assert streamed == r.output_text and text == m.content[0].text
        return r.output_text, text

    assert asyncio.run(both_async()) == (expected, expected)


def test_max_output_tokens_cuts_and_says_so():
    """Cut at the token limit: a Responses ``incomplete`` response, a Messages ``max_tokens`` stop,
    in-process and through the proxy (the scripted model of the replay mode ignores limits)."""
    from gnll.serving import create_app
    from gnll.serving.proxy import ProxyService

    with ServerThread(build_inprocess_app(StreamingModel(), ServeSettings(), max_wait_ms=1)) as up:
        service = ProxyService(up.url + "/v1", timeout=30)
        with ServerThread(create_app(service, ServeSettings())) as px:
            for srv in (up, px):
                body = {"model": "streaming", "input": "unsure", "max_output_tokens": 1}
                resp = Response.model_validate(post(srv, "/v1/responses", body).json())
                assert resp.status == "incomplete"
                assert resp.incomplete_details.reason == "max_output_tokens"
                assert resp.output_text == "Maybe" and resp.output[0].status == "incomplete"
                assert resp.output[0].uncertainty["num_tokens"] == 1
                s = post(srv, "/v1/responses", {**body, "stream": True})
                assert named_events(s.text)[-1][0] == "response.incomplete"
                path, body = request("messages", "streaming", "unsure", max_tokens=1)
                m = Message.model_validate(post(srv, path, body).json())
                assert m.stop_reason == "max_tokens"
                events = named_events(post(srv, path, {**body, "stream": True}).text)
                assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"


def test_what_gnll_cannot_honour_is_a_400_in_each_apis_envelope(server):  # noqa: F811
    srv = server
    for extra, param in (
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0"),
    ):
        r = post(srv, "/v1/responses", {"model": srv.model_id, "input": "x", **extra})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
    oc = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="does not store responses"):
        oc.responses.create(model=srv.model_id, input="x", previous_response_id="resp_1")
    ac = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="top_k") as err:
        ac.messages.create(
            model=srv.model_id,
            max_tokens=8,
            extra_body={"top_k": 5},
            messages=[{"role": "user", "content": "x"}],
        )
    assert err.value.body["type"] == "error" and err.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        ac.messages.create(
            model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )
    missing = post(srv, "/v1/messages", {"model": srv.model_id, "messages": []})
    assert missing.status_code == 400 and missing.json()["type"] == "error"


def test_the_anthropic_sdks_api_key_header_is_accepted():
    settings = ServeSettings(api_key="sekret")
    with ServerThread(build_inprocess_app(StreamingModel(), settings, max_wait_ms=1)) as srv:
        user = [{"role": "user", "content": "unsure"}]
        good = anthropic.Anthropic(base_url=srv.url, api_key="sekret", max_retries=0)
        assert good.messages.create(model="streaming", max_tokens=8, messages=user).content
        bad = anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError):
            bad.messages.create(model="streaming", max_tokens=8, messages=user)


def test_requests_are_logged_with_their_api(server, caplog):  # noqa: F811
    srv = server
    with access_log(caplog):
        for api in APIS:
            path, body = request(api, srv.model_id, "unsure")
            assert post(srv, path, body).status_code == 200
    entries = [json.loads(x.message) for x in caplog.records if x.name == "gnll.serve.access"]
    mine = {e["api"]: e for e in entries if e.get("api") in APIS}
    assert set(mine) == set(APIS)
    for api, entry in mine.items():
        assert entry["path"] == f"/v1/{api}" and entry["g_nll"] == [pytest.approx(5.0)]


def test_a_reasoning_models_trace_is_a_reasoning_item_and_a_thinking_block():
    """The trace comes back as the API's own trace item; G-NLL is the answer's given the trace."""
    from gnll.backends.reasoning_model import ReasoningModel

    with ServerThread(build_inprocess_app(ReasoningModel(Thinker()), ServeSettings())) as srv:
        r = post(srv, "/v1/responses", {"input": "capital?", "max_output_tokens": 50})
        resp = Response.model_validate(r.json())
        kinds = [item.type for item in resp.output]
        assert kinds == ["reasoning", "message"], kinds
        assert resp.output[0].content[0].text.split() == [t.strip() for t in THOUGHTS_TEXT]
        for item in resp.output:
            assert item.uncertainty["g_nll"] == pytest.approx(0.03)
            assert item.uncertainty["trace_tokens"] == len(THOUGHTS_TEXT)
        assert resp.usage.output_tokens_details.reasoning_tokens == len(THOUGHTS_TEXT)
        # A stream carries the trace too: a reasoning item with reasoning_text deltas, before the
        # answer's message item, as the whole response has it.
        s = post(srv, "/v1/responses", {"input": "capital?", "stream": True})
        _, records, final = stream_answer("responses", s.text)
        assert all(rec["g_nll"] == pytest.approx(0.03) for rec in records)
        assert all(rec["trace_tokens"] == len(THOUGHTS_TEXT) for rec in records)
        events = named_events(s.text)
        added = [d["item"]["type"] for k, d in events if k == "response.output_item.added"]
        assert added == ["reasoning", "message"]
        trace = "".join(d["delta"] for k, d in events if k == "response.reasoning_text.delta")
        assert trace == resp.output[0].content[0].text
        assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
        assert final["output"][0]["content"][0]["text"] == trace
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        with client.responses.stream(model="thinker", input="capital?") as stream:
            got = stream.get_final_response()
        assert [item.type for item in got.output] == ["reasoning", "message"]
        assert got.output[0].content[0].text == trace and got.output_text == resp.output_text
        path, body = request("messages", "thinker", "capital?", max_tokens=50)
        m = Message.model_validate(post(srv, path, body).json())
        assert [b.type for b in m.content] == ["thinking", "text"]
        assert m.uncertainty["g_nll"] == pytest.approx(0.03)
        _, records, _ = stream_answer("messages", post(srv, path, {**body, "stream": True}).text)
        assert records[0]["g_nll"] == pytest.approx(0.03)
        ac = anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0)
        with ac.messages.stream(**body) as stream:
            streamed = stream.get_final_message()
        assert [b.type for b in streamed.content] == ["thinking", "text"]
        assert streamed.content[0].thinking == m.content[0].thinking == trace


def test_a_refused_reasoning_answers_stream_withholds_its_trace():
    """Under refuse the trace is withheld with the answer, in a stream as in a whole response."""
    from gnll.backends.reasoning_model import ReasoningModel

    policy = AbstentionPolicy(mode="refuse", threshold=1e-6, refusal=REFUSAL)
    app = build_inprocess_app(ReasoningModel(Thinker()), ServeSettings(policy=policy))
    with ServerThread(app) as srv:
        for api in APIS:
            for stream in (False, True):
                path, body = request(api, "thinker", "capital?", stream=stream)
                r = post(srv, path, body)
                assert r.status_code == 200 and REFUSAL in r.text, r.text
                assert " t0 " not in r.text and "Paris" not in r.text


def test_refuse_under_the_proxy_withholds_the_answer_on_both_apis():
    """A proxy under refuse, in front of a plain in-process server: the refused text never leaves."""
    from gnll.serving import create_app
    from gnll.serving.proxy import ProxyService

    with ServerThread(build_inprocess_app(StreamingModel(), ServeSettings(), max_wait_ms=1)) as up:
        policy = AbstentionPolicy(mode="refuse", threshold=1.0, refusal=REFUSAL)
        service = ProxyService(up.url + "/v1", timeout=30)
        with ServerThread(create_app(service, ServeSettings(policy=policy))) as px:
            for api in APIS:
                for stream in (False, True):
                    path, body = request(api, "streaming", "unsure", stream=stream)
                    r = post(px, path, body)
                    assert r.status_code == 200, r.text
                    assert REFUSAL in r.text and "Maybe" not in r.text and "Lyon" not in r.text


def test_metrics_and_otel_events_name_the_api(otel):
    from gnll.serving.tracing import Emitter

    exp, provider = otel
    settings = ServeSettings(tracing=Emitter(provider))
    with ServerThread(build_inprocess_app(StreamingModel(), settings, max_wait_ms=1)) as srv:
        ids = {}
        for api in APIS:
            path, body = request(api, "streaming", "unsure")
            ids[api] = post(srv, path, body).json()["id"]
            s = post(srv, path, {**body, "stream": True})
            assert s.status_code == 200
        srv.model_id = "streaming"
        chat(srv, "unsure")
        metrics = httpx.get(srv.url + "/metrics").text
    for api in ("responses", "messages", "chat.completions"):
        want = 1 if api == "chat.completions" else 2
        assert f'gnll_api_answers_total{{api="{api}"}} {float(want)}' in metrics, metrics
        assert (
            f'gnll_requests_total{{endpoint="/v1/{api.replace(".", "/")}",status="200"}}' in metrics
        )
    got = [dict(getattr(i, "log_record", i).attributes) for i in exp.get_finished_logs()]
    by_api = {}
    for attrs in got:
        by_api.setdefault(attrs["gnll.api"], []).append(attrs)
    assert sorted(by_api) == ["chat.completions", "messages", "responses"]
    assert by_api["responses"][0]["gen_ai.response.id"] == ids["responses"]
    assert by_api["messages"][0]["gen_ai.response.id"] == ids["messages"]
    assert by_api["responses"][1]["gen_ai.response.id"].startswith("resp_")  # the stream's
    assert by_api["messages"][1]["gen_ai.response.id"].startswith("msg_")
    assert all(a["gen_ai.evaluation.score.value"] == 5.0 for a in got)


def test_the_pages_config_lists_every_api(server):  # noqa: F811
    config = httpx.get(server.url + "/ui/api/config").json()
    assert {"/v1/responses", "/v1/messages", "/v1/chat/completions"} <= set(config["apis"])
