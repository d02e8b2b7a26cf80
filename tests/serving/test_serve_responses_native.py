"""The proxy's pass-through of ``/v1/responses`` (:mod:`gnll.serving.native`), on a stand-in upstream
that answers as vLLM does (``owned_by: vllm``; its Responses and chat bodies in vLLM 0.32's shape,
the end-of-sequence token's log-prob included): which requests go to the upstream's own route and
which are translated, what is added to the request and removed from the answer, the policy, and an
upstream without the route. The real vLLM: tests/serving/test_serve_responses_native_vllm.py."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from gnll.serving import AbstentionPolicy, ServeSettings, create_app
from gnll.serving.proxy import ProxyService
from gnll.serving.server import ServerThread

TOKENS = [("Paris", -0.25), (".", -0.5), ("<|im_end|>", -0.125)]
G_NLL = 0.75  # the answer's tokens; the EOS token is the terminator


def _logprobs() -> list[dict]:
    return [
        {"token": t, "bytes": list(t.encode()), "logprob": lp, "top_logprobs": []}
        for t, lp in TOKENS
    ]


def response_body(logprobs: list[dict] | None) -> dict:
    """vLLM 0.32's non-streamed Responses body for the answer "Paris."."""
    part = {"annotations": [], "text": "Paris.", "type": "output_text", "logprobs": logprobs}
    return {
        "id": "resp_up",
        "created_at": 1,
        "object": "response",
        "model": "m",
        "status": "completed",
        "incomplete_details": None,
        "output": [
            {
                "id": "msg_up",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [part],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "none",
        "tools": [],
        "usage": {
            "input_tokens": 5,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 3,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 8,
        },
    }


def stream_of(whole: dict) -> str:
    """The events vLLM 0.32 streams for ``whole``: a delta per text token (with its log-prob when
    asked), none for the EOS token, whose log-prob is only in the closing events' whole part."""
    item, part = whole["output"][0], whole["output"][0]["content"][0]
    asked = part["logprobs"] is not None
    opened = {**item, "status": "in_progress", "content": []}
    empty = {**part, "text": "", "logprobs": []}
    events = [
        {"type": "response.created", "response": {**whole, "status": "in_progress", "output": []}},
        {
            "type": "response.in_progress",
            "response": {**whole, "status": "in_progress", "output": []},
        },
        {"type": "response.output_item.added", "output_index": 0, "item": opened},
        {
            "type": "response.content_part.added",
            "item_id": "msg_up",
            "output_index": 0,
            "content_index": 0,
            "part": empty,
        },
    ]
    for entry in _logprobs()[:-1]:
        lps = [{k: entry[k] for k in ("token", "logprob", "top_logprobs")}] if asked else []
        events.append(
            {
                "type": "response.output_text.delta",
                "item_id": "msg_up",
                "output_index": 0,
                "content_index": 0,
                "delta": entry["token"],
                "logprobs": lps,
            }
        )
    events += [
        {
            "type": "response.output_text.done",
            "item_id": "msg_up",
            "output_index": 0,
            "content_index": 0,
            "text": "Paris.",
            "logprobs": [],
        },
        {
            "type": "response.content_part.done",
            "item_id": "msg_up",
            "output_index": 0,
            "content_index": 0,
            "part": part,
        },
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": whole},
    ]
    return "".join(
        f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': k})}\n\n"
        for k, e in enumerate(events)
    )


def stand_in(*, responses: bool = True) -> tuple[FastAPI, dict[str, list]]:
    """A vLLM-shaped upstream; ``seen`` holds the bodies each route received."""
    app = FastAPI()
    seen: dict[str, list] = {"responses": [], "chat": []}

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": "m", "owned_by": "vllm", "max_model_len": 512}]}

    if responses:

        @app.post("/v1/responses", response_model=None)
        async def respond(request: Request) -> JSONResponse | StreamingResponse:
            body = await request.json()
            seen["responses"].append(body)
            if not isinstance(body.get("input"), str | list):
                return JSONResponse({"error": {"message": "input", "code": 400}}, 400)
            asked = "message.output_text.logprobs" in (body.get("include") or [])
            whole = response_body(_logprobs() if asked else None)
            if not body.get("stream"):
                return JSONResponse(whole)
            return StreamingResponse(iter([stream_of(whole)]), media_type="text/event-stream")

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> StreamingResponse | dict:
        body = await request.json()
        seen["chat"].append(body)
        if not body.get("stream"):
            message = {"role": "assistant", "content": "Paris."}
            return {
                "id": "c",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": {"content": _logprobs()},
                        "finish_reason": "stop",
                        "stop_reason": None,
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
            }
        chunks = []
        for k, entry in enumerate(_logprobs()):
            text = "" if k == len(TOKENS) - 1 else entry["token"]
            chunks.append(
                {
                    "id": "c",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": "m",
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": text},
                            "logprobs": {"content": [entry]},
                            "finish_reason": "stop" if k == len(TOKENS) - 1 else None,
                            "stop_reason": None,
                        }
                    ],
                }
            )
        lines = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
        return StreamingResponse(iter([lines + "data: [DONE]\n\n"]), media_type="text/event-stream")

    return app, seen


@pytest.fixture()
def proxied(request):
    params = getattr(request, "param", {})
    app, seen = stand_in(responses=params.get("responses", True))
    settings = ServeSettings(policy=params.get("policy") or AbstentionPolicy())
    with (
        ServerThread(app) as up,
        ServerThread(create_app(ProxyService(up.url + "/v1"), settings)) as px,
    ):
        yield px, seen


def post(px, body: dict) -> httpx.Response:
    return httpx.post(px.url + "/v1/responses", json=body, timeout=30)


def test_a_whole_answer_comes_from_the_upstreams_own_route_scored(proxied):
    px, seen = proxied
    r = post(px, {"input": "Capital of France?", "max_output_tokens": 8})
    assert r.status_code == 200, r.text
    assert r.headers["x-gnll-served-via"] == "responses"
    resp = Response.model_validate(r.json())
    assert resp.id == "resp_up" and resp.output_text == "Paris."
    # what G-NLL needs was added upstream: the log-probs, greedy pinned in vLLM's names, the model
    sent = seen["responses"][-1]
    assert sent["include"] == ["message.output_text.logprobs"]
    assert sent["temperature"] == 0.0 and sent["top_k"] == -1 and sent["model"] == "m"
    assert sent["max_output_tokens"] == 8 and "max_tokens" not in sent
    assert not seen["chat"]
    # ... and the log-probs the client did not ask for are gone again
    assert resp.output[0].content[0].logprobs is None
    record = resp.output[0].uncertainty
    assert record["g_nll"] == pytest.approx(G_NLL) and record["num_tokens"] == 2
    assert float(r.headers["x-uncertainty-g-nll"]) == pytest.approx(G_NLL)


def test_asked_log_probs_are_kept_and_the_sdk_parses_them(proxied):
    px, seen = proxied
    client = openai.OpenAI(base_url=px.url + "/v1", api_key="x", max_retries=0, timeout=30)
    raw = client.responses.with_raw_response.create(
        model="m", input="Capital of France?", include=["message.output_text.logprobs"]
    )
    assert raw.headers["x-gnll-served-via"] == "responses"
    resp = raw.parse()
    lps = resp.output[0].content[0].logprobs
    assert [lp.token for lp in lps] == [t for t, _ in TOKENS]
    assert -sum(lp.logprob for lp in lps[:-1]) == pytest.approx(resp.output[0].uncertainty["g_nll"])
    assert seen["responses"][-1]["include"] == ["message.output_text.logprobs"]


def test_a_stream_is_relayed_and_its_closing_events_carry_the_record(proxied):
    px, seen = proxied
    adapter = TypeAdapter(ResponseStreamEvent)
    r = post(px, {"input": "Capital of France?", "stream": True})
    assert r.headers["x-gnll-served-via"] == "responses" and not seen["chat"]
    assert seen["responses"][-1]["stream"] is True
    events = [adapter.validate_json(x[6:]) for x in r.text.splitlines() if x.startswith("data: ")]
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))  # upstream's, in order
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for e in deltas) == "Paris." and all(not e.logprobs for e in deltas)
    done = next(e for e in events if e.type == "response.output_item.done")
    assert done.item.uncertainty["g_nll"] == pytest.approx(G_NLL)
    assert done.item.content[0].logprobs is None  # not asked for: removed again
    final = events[-1].response
    assert final.output[0].uncertainty["g_nll"] == pytest.approx(G_NLL)
    assert final.output[0].content[0].logprobs is None
    client = openai.OpenAI(base_url=px.url + "/v1", api_key="x", max_retries=0, timeout=30)
    with client.responses.stream(
        model="m", input="Capital of France?", include=["message.output_text.logprobs"]
    ) as stream:
        got = stream.get_final_response()
    assert got.output_text == "Paris." and got.output[0].uncertainty["num_tokens"] == 2
    assert [lp.token for lp in got.output[0].content[0].logprobs] == [t for t, _ in TOKENS]


def test_tools_and_json_are_translated_to_chat(proxied):
    px, seen = proxied
    fmt = {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}}
    post(px, {"input": "Capital of France?", "text": fmt})  # the chat path's own answer or 400
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    post(px, {"input": "Capital of France?", "tools": [tool]})
    assert not [b for b in seen["responses"] if isinstance(b.get("input"), str)]


@pytest.mark.parametrize(
    "proxied",
    [{"policy": AbstentionPolicy(mode="refuse", threshold=0.1, refusal="I do not know.")}],
    indirect=True,
)
def test_refuse_withholds_the_upstreams_answer(proxied):
    px, _ = proxied
    body = {"input": "Capital of France?", "include": ["message.output_text.logprobs"]}
    r = post(px, body)
    assert r.headers["x-gnll-served-via"] == "responses"
    resp = Response.model_validate(r.json())
    assert resp.output_text == "I do not know." and "Paris" not in r.text
    assert resp.output[0].content[0].logprobs is None
    assert resp.output[0].uncertainty["refused"] is True
    # a stream the policy holds is the chat path's replay
    s = post(px, {**body, "stream": True})
    assert s.headers["x-gnll-served-via"] == "chat.completions"
    assert "I do not know." in s.text and "Paris" not in s.text


@pytest.mark.parametrize("proxied", [{"responses": False}], indirect=True)
def test_an_upstream_without_the_route_is_asked_once_and_translated(proxied):
    px, seen = proxied
    for _ in range(2):
        r = post(px, {"input": "Capital of France?"})
        assert r.status_code == 200, r.text
        assert r.headers["x-gnll-served-via"] == "chat.completions"
        resp = Response.model_validate(r.json())
        assert resp.output[0].uncertainty["g_nll"] == pytest.approx(G_NLL)
    assert len(seen["chat"]) == 2


def test_the_probe_generates_nothing_and_is_sent_once(proxied):
    px, seen = proxied
    for _ in range(3):
        post(px, {"input": "Capital of France?"})
    probes = [b for b in seen["responses"] if not isinstance(b.get("input"), str)]
    assert len(probes) == 1 and len(seen["responses"]) == 4
    assert math.isclose(probes[0]["max_output_tokens"], 1)
