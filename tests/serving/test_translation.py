"""The translation between chat completions and the Responses / Messages APIs, without a server:
requests become the chat requests they mean, and chat streams (reasoning, text, tool calls, an
error) become event sequences the SDKs' own types and stream accumulators accept."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from gnll.serving.errors import RequestError
from gnll.serving.messages_api import MessagesAPI
from gnll.serving.protocol.messages import MessagesRequest
from gnll.serving.protocol.responses import ResponsesRequest
from gnll.serving.responses import Reply, sse
from gnll.serving.responses_api import ResponsesAPI
from gnll.serving.schemas import ChatCompletionRequest

RECORD = {"g_nll": 1.25, "abstain": False, "num_tokens": 3}


def chunk(delta=None, finish=None, uncertainty=None, usage=None, logprobs=None) -> str:
    choices = []
    if delta is not None or finish is not None:
        c = {"index": 0, "delta": delta or {}, "logprobs": logprobs, "finish_reason": finish}
        if uncertainty is not None:
            c["uncertainty"] = uncertainty
        choices.append(c)
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return sse({**body, "choices": choices, **({"usage": usage} if usage else {})})


def tool_delta(k: int, *, id_=None, name=None, args="") -> dict:
    fn = {"arguments": args, **({"name": name} if name else {})}
    return {"tool_calls": [{"index": k, **({"id": id_} if id_ else {}), "function": fn}]}


CHAT_STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"reasoning": "Think"}),
    chunk({"reasoning": " hard."}),
    chunk({"content": "Calling"}),
    chunk(tool_delta(0, id_="call_a", name="weather", args='{"ci')),
    chunk(tool_delta(0, args='ty": "Paris"}')),
    chunk(tool_delta(1, id_="call_b", name="time", args="{}")),
    chunk({}, finish="tool_calls", uncertainty=RECORD),
    chunk(usage={"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16}),
    sse("[DONE]"),
]


def events(text: str) -> list[dict]:
    out = []
    for block in text.split("\n\n"):
        if block.strip():
            name, data = block.split("\n", 1)
            payload = json.loads(data[6:])
            assert name == "event: " + payload["type"]
            out.append(payload)
    return out


def run(api, raw: dict, stream: list[str]) -> list[dict]:
    req = api.parse(raw)
    chat = ChatCompletionRequest.model_validate(api.chat_body(req))
    reply = api.reply(Reply(None, [], iter(stream)), req, chat)

    async def collect() -> str:
        return "".join([piece async for piece in reply.stream])

    return events(asyncio.run(collect()))


def test_a_chat_stream_becomes_responses_events_the_sdk_accumulates():
    from openai.lib.streaming.responses._responses import ResponseStreamState

    out = run(ResponsesAPI(), {"input": "x", "stream": True, "model": "m"}, CHAT_STREAM)
    adapter = TypeAdapter(ResponseStreamEvent)
    state = ResponseStreamState(input_tools=[], text_format=openai.omit)
    for data in out:
        state.handle_event(adapter.validate_python(data))
    kinds = [e["type"] for e in out]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    args = [e["delta"] for e in out if e["type"] == "response.function_call_arguments.delta"]
    assert args == ['{"ci', 'ty": "Paris"}', "{}"]
    final = Response.model_validate(out[-1]["response"])
    assert [i.type for i in final.output] == [
        "reasoning",
        "message",
        "function_call",
        "function_call",
    ]
    assert final.output[0].content[0].text == "Think hard."
    assert final.output_text == "Calling"
    calls = [(i.call_id, i.name, i.arguments) for i in final.output[2:]]
    assert calls == [("call_a", "weather", '{"city": "Paris"}'), ("call_b", "time", "{}")]
    assert all(i.uncertainty == RECORD for i in final.output)
    assert final.usage.input_tokens == 7 and final.usage.output_tokens == 9
    done = [e["item"] for e in out if e["type"] == "response.output_item.done"]
    assert all(i["uncertainty"] == RECORD for i in done)
    snapshot = state._ResponseStreamState__current_snapshot  # what .get_final_response() builds on
    assert [i.type for i in snapshot.output] == [i.type for i in final.output]


def test_a_chat_stream_becomes_messages_events_the_sdk_accumulates():
    from anthropic.lib.streaming._messages import accumulate_event

    raw = {
        "model": "m",
        "max_tokens": 9,
        "stream": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    out = run(MessagesAPI(), raw, CHAT_STREAM)
    adapter = TypeAdapter(RawMessageStreamEvent)
    snapshot, bufs = None, {}
    for data in out:
        ev = adapter.validate_python(data)
        snapshot = accumulate_event(event=ev, current_snapshot=snapshot, json_bufs=bufs)
    message = Message.model_validate(snapshot.model_dump())
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert message.content[0].thinking == "Think hard." and message.content[1].text == "Calling"
    assert message.content[2].input == {"city": "Paris"} and message.content[3].name == "time"
    assert message.stop_reason == "tool_use"
    assert message.usage.input_tokens == 7 and message.usage.output_tokens == 9
    assert out[-2]["type"] == "message_delta" and out[-2]["uncertainty"] == RECORD
    starts = [e["index"] for e in out if e["type"] == "content_block_start"]
    stops = [e["index"] for e in out if e["type"] == "content_block_stop"]
    assert starts == stops == [0, 1, 2, 3]  # one block at a time


def test_an_error_in_the_chat_stream_ends_either_stream_with_an_error_event():
    broken = [
        chunk({"content": "Par"}),
        sse({"error": {"message": "upstream broke off", "type": "upstream_error"}}),
    ]
    out = run(ResponsesAPI(), {"input": "x", "stream": True}, broken)
    assert out[-1]["type"] == "error" and out[-1]["message"] == "upstream broke off"
    TypeAdapter(ResponseStreamEvent).validate_python(out[-1])
    raw = {"max_tokens": 9, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    out = run(MessagesAPI(), raw, broken)
    assert out[-1] == {
        "type": "error",
        "error": {"type": "api_error", "message": "upstream broke off"},
    }


def test_responses_input_items_become_the_chat_conversation():
    req = ResponsesRequest.model_validate(
        {
            "instructions": "Use tools.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "t", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Sunny."}],
                },
            ],
            "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "w"},
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 3,
            "max_output_tokens": 20,
        }
    )
    body = ResponsesAPI().chat_body(req)
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert [c["id"] for c in body["messages"][2]["tool_calls"]] == ["c1", "c2"]
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    assert body["tools"] == [
        {"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert (body["logprobs"], body["top_logprobs"], body["max_tokens"]) == (True, 3, 20)
    ChatCompletionRequest.model_validate(body)


def test_messages_blocks_become_the_chat_conversation():
    req = MessagesRequest.model_validate(
        {
            "max_tokens": 5,
            "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["\n"],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": ""},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Paris"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "sunny"}],
                        }
                    ],
                },
            ],
            "tools": [{"name": "w", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"},
        }
    )
    body = MessagesAPI().chat_body(req)
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool"]
    assistant = body["messages"][2]
    assert assistant["content"] == "Checking."
    assert assistant["tool_calls"][0]["function"] == {"name": "w", "arguments": '{"city": "Paris"}'}
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "t1", "content": "sunny"}
    assert body["tool_choice"] == "required" and body["stop"] == ["\n"]
    ChatCompletionRequest.model_validate(body)


@pytest.mark.parametrize(
    "raw,param",
    [
        (
            {
                "max_tokens": 5,
                "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}],
            },
            "messages.0.content.0",
        ),
        ({"max_tokens": 5, "top_k": 3, "messages": [{"role": "user", "content": "x"}]}, "top_k"),
        (
            {
                "max_tokens": 5,
                "tools": [{"type": "web_search_20250305", "name": "s"}],
                "messages": [{"role": "user", "content": "x"}],
            },
            "tools",
        ),
    ],
)
def test_what_messages_cannot_honour_names_the_field(raw, param):
    api = MessagesAPI()
    with pytest.raises(RequestError) as err:
        api.chat_body(api.parse(raw))
    assert err.value.param == param
