"""Tool calls through the four framework integrations, against the real in-process ``gnll serve``
(a scripted tool-calling model, tool_helpers.AgentModel): each call's record (G-NLL, the function
name's NLL, each argument value's NLL and tokens, the least certain argument, withheld) equals the
server's own record of the same call, and under ``refuse`` a withheld call reaches the framework as
no callable call: no tool runs."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from integration_helpers import require
from tool_helpers import QUESTION, SECRET, SECRET_LOGPROB, TOOLS, agent_server, server_record

pytestmark = [pytest.mark.integration]

THRESHOLD = 2.0  # the call's G-NLL is above it (its argument's token alone has NLL 3)


@pytest.fixture(scope="module")
def srv():
    with agent_server() as s:
        s.ref = server_record(s)
        yield s


def same_calls(got: list[dict], ref: list[dict]) -> None:
    assert len(got) == len(ref) >= 1
    for g, r in zip(got, ref, strict=True):
        assert abs(g["g_nll"] - r["g_nll"]) <= 1e-6  # same path: the server's log-probs re-read
        assert abs(g["name_nll"] - r["name_nll"]) <= 1e-6  # same path: as above
        assert g["name"] == r["name"] and g["token_indices"] == r["token_indices"]
        assert g["least_certain_argument"] == r["least_certain_argument"] == "city"
        assert [(a["path"], a["token_indices"]) for a in g["arguments"]] == [
            (a["path"], a["token_indices"]) for a in r["arguments"]
        ]
        for a, b in zip(g["arguments"], r["arguments"], strict=True):
            assert abs(a["nll"] - b["nll"]) <= 1e-6  # same path: as above
        assert g["withheld"] is False


def test_the_server_reference_is_the_scripted_call(srv):
    [call] = srv.ref["tool_calls"]
    [arg] = call["arguments"]
    assert (arg["path"], arg["text"]) == ("city", SECRET)
    assert arg["nll"] == pytest.approx(-SECRET_LOGPROB)
    assert call["g_nll"] > THRESHOLD


def _no_secret(obj) -> None:
    dump = getattr(obj, "model_dump", None)
    text = json.dumps(dump() if dump is not None else obj, default=repr)
    assert SECRET not in text, text[:600]


# ---------------------------------------------------------------------------------- LangChain
def _chat(url):
    require("langchain_openai")
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(base_url=url + "/v1", api_key="x", model="agent", max_retries=0)


def test_langchain_bind_tools_carries_each_calls_record(srv):
    from gnll.integrations.langchain import with_uncertainty

    llm = with_uncertainty(_chat(srv.url), server="gnll").bind_tools(TOOLS)
    m = llm.invoke(QUESTION)
    assert [(c["name"], c["args"]) for c in m.tool_calls] == [("get_weather", {"city": SECRET})]
    same_calls(m.response_metadata["uncertainty"]["tool_calls"], srv.ref["tool_calls"])
    chunks = list(llm.stream(QUESTION))
    whole = sum(chunks[1:], chunks[0])
    assert [c["name"] for c in whole.tool_calls] == ["get_weather"]
    same_calls(chunks[-1].response_metadata["uncertainty"]["tool_calls"], srv.ref["tool_calls"])
    # tools bound before wrapping: the same
    bound = with_uncertainty(_chat(srv.url).bind_tools(TOOLS), server="gnll")
    same_calls(bound.invoke(QUESTION).response_metadata["uncertainty"]["tool_calls"], srv.ref["tool_calls"])


@pytest.mark.parametrize("gate", ["call", "argument"])
def test_langchain_refuse_withholds_the_call(srv, gate):
    from gnll.integrations.langchain import with_uncertainty

    options = (
        {"threshold": THRESHOLD}
        if gate == "call"
        else {"threshold": 100.0, "tool_argument_threshold": 1.0}
    )
    llm = with_uncertainty(_chat(srv.url), server="gnll", policy="refuse", **options)
    llm = llm.bind_tools(TOOLS)
    m = llm.invoke(QUESTION)
    assert m.tool_calls == [] and not m.invalid_tool_calls
    assert "withheld: get_weather" in m.content
    rec = m.response_metadata["uncertainty"]
    assert rec["refused"] and rec["tool_calls"][0]["withheld"]
    _no_secret(m)
    chunks = list(llm.stream(QUESTION))
    assert len(chunks) == 1 and chunks[0].tool_call_chunks == []
    _no_secret(chunks)


# ---------------------------------------------------------------------------------- LiteLLM
def _litellm():
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    return require("litellm")


def _request(srv, **kw):
    return {
        "model": "openai/agent",
        "api_base": srv.url + "/v1",
        "api_key": "x",
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": TOOLS,
        **kw,
    }


def test_litellm_completion_with_tools_record_from_the_response(srv):
    litellm = _litellm()
    from gnll.integrations.core import AnswerScorer
    from gnll.integrations.litellm import score_response

    r = litellm.completion(**_request(srv, logprobs=True, top_logprobs=1, temperature=0))
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    [scored] = score_response(r, AnswerScorer(server="gnll"))
    same_calls(scored.uncertainty.tool_calls, srv.ref["tool_calls"])
    # the proxy's hooks: the record on the choice
    from gnll.integrations.litellm import UncertaintyHandler

    handler = UncertaintyHandler(server="gnll")

    async def hooked():
        data = await handler.async_pre_call_hook(None, None, _request(srv), "completion")
        sent = {k: v for k, v in data.items() if k != "metadata"}
        response = await litellm.acompletion(**sent)
        return await handler.async_post_call_success_hook(data, None, response)

    out = asyncio.run(hooked())
    same_calls(out.choices[0].uncertainty["tool_calls"], srv.ref["tool_calls"])
    assert out.choices[0].message.tool_calls[0].function.name == "get_weather"


@pytest.mark.parametrize("stream", [False, True])
def test_litellm_refuse_withholds_the_call(srv, stream):
    litellm = _litellm()
    from gnll.integrations.litellm import UncertaintyHandler

    handler = UncertaintyHandler(policy="refuse", threshold=THRESHOLD, server="gnll")

    async def run():
        data = await handler.async_pre_call_hook(None, None, _request(srv, stream=stream), "completion")
        sent = {k: v for k, v in data.items() if k != "metadata"}
        response = await litellm.acompletion(**sent)
        if not stream:
            return [await handler.async_post_call_success_hook(data, None, response)]
        hook = handler.async_post_call_streaming_iterator_hook(None, response, data)
        return [chunk async for chunk in hook]

    out = asyncio.run(run())
    _no_secret(out)
    last = out[-1].choices[0]
    rec = last.uncertainty
    assert rec["refused"] and rec["tool_calls"][0]["withheld"]
    message = last.delta if stream else last.message
    assert not getattr(message, "tool_calls", None) and "withheld: get_weather" in message.content
    assert last.finish_reason == "stop"


# ---------------------------------------------------------------------------------- LlamaIndex
def _weather_tool(ran: list):
    require("llama_index.llms.openai_like")
    from llama_index.core.tools import FunctionTool

    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"Sunny in {city}."

    return FunctionTool.from_defaults(fn=get_weather)


def _llamaindex(srv, **options):
    require("llama_index.llms.openai_like")
    from llama_index.llms.openai_like import OpenAILike

    from gnll.integrations.llamaindex import with_uncertainty

    llm = OpenAILike(
        model="agent",
        api_base=srv.url + "/v1",
        api_key="x",
        is_chat_model=True,
        is_function_calling_model=True,
    )
    return with_uncertainty(llm, server="gnll", **options)


def test_llamaindex_chat_with_tools_and_predict_and_call(srv):
    ran: list = []
    tool = _weather_tool(ran)
    llm = _llamaindex(srv)
    r = llm.chat_with_tools([tool], user_msg=QUESTION)
    [sel] = llm.get_tool_calls_from_response(r)
    assert (sel.tool_name, sel.tool_kwargs) == ("get_weather", {"city": SECRET})
    same_calls(r.additional_kwargs["uncertainty"]["tool_calls"], srv.ref["tool_calls"])
    *_, last = llm.stream_chat_with_tools([tool], user_msg=QUESTION)
    same_calls(last.additional_kwargs["uncertainty"]["tool_calls"], srv.ref["tool_calls"])
    out = llm.predict_and_call([tool], user_msg=QUESTION)
    assert ran == [SECRET] and out.response == f"Sunny in {SECRET}."
    out = asyncio.run(llm.apredict_and_call([tool], user_msg=QUESTION))
    assert ran == [SECRET, SECRET]


def test_llamaindex_refuse_runs_no_tool(srv):
    ran: list = []
    tool = _weather_tool(ran)
    llm = _llamaindex(srv, policy="refuse", threshold=THRESHOLD)
    r = llm.chat_with_tools([tool], user_msg=QUESTION)
    assert llm.get_tool_calls_from_response(r, error_on_no_tool_call=False) == []
    rec = r.additional_kwargs["uncertainty"]
    assert rec["refused"] and rec["tool_calls"][0]["withheld"]
    _no_secret({"message": r.message, "raw": r.raw, "kwargs": r.additional_kwargs})
    out = llm.predict_and_call([tool], user_msg=QUESTION)
    assert ran == [] and "withheld: get_weather" in out.response
    streamed = list(llm.stream_chat_with_tools([tool], user_msg=QUESTION))
    assert len(streamed) == 1 and "withheld" in streamed[0].message.content
    _no_secret([{"message": x.message, "delta": x.delta, "raw": x.raw} for x in streamed])


# ---------------------------------------------------------------------------------- DSPy
def _react(srv, ran, **options):
    dspy = require("dspy")
    from gnll.integrations.dspy import with_tool_uncertainty

    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"Sunny in {city}."

    lm = dspy.LM("openai/agent", api_base=srv.url + "/v1", api_key="x", cache=False)
    agent = with_tool_uncertainty(
        dspy.ReAct("question -> answer", tools=[get_weather], max_iters=3),
        server="gnll",
        **options,
    )
    return dspy, lm, agent


def test_dspy_react_step_carries_the_calls_record(srv):
    from tool_helpers import REACT_CALL, tokens_of

    ran: list = []
    dspy, lm, agent = _react(srv, ran)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = agent(question=QUESTION)
    assert ran == [SECRET] and pred.answer == "Sunny"
    first = agent.react.records[0]
    [call] = first["tool_calls"]
    tokens, lps = tokens_of(REACT_CALL)
    [arg] = call["arguments"]
    assert (arg["path"], arg["text"], arg["token_indices"]) == ("city", SECRET, [tokens.index(SECRET)])
    assert arg["nll"] == pytest.approx(-SECRET_LOGPROB)
    assert call["name_nll"] == pytest.approx(0.05)  # "get_weather" is one token
    assert [tokens[k] for k in call["name_tokens"]] == ["get_weather"]
    # the call's tokens: from the name's field value to the arguments' object's end
    start = tokens.index("get_weather")
    assert call["token_indices"] == list(range(start, tokens.index('"}') + 1))
    assert call["g_nll"] == pytest.approx(-sum(lps[k] for k in call["token_indices"]))
    assert call["least_certain_argument"] == "city" and call["withheld"] is False
    assert "tool_calls" not in agent.react.records[1] or not agent.react.records[1]["tool_calls"]


def test_dspy_react_refuse_runs_no_tool(srv):
    ran: list = []
    dspy, lm, agent = _react(srv, ran, policy="refuse", threshold=THRESHOLD)
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = agent(question=QUESTION)
    assert ran == []
    rec = agent.react.records[0]
    assert rec["refused"] and rec["tool_calls"][0]["withheld"]
    assert "withheld: get_weather" in pred.trajectory["thought_0"]
    assert pred.trajectory["tool_name_0"] == "finish"
    _no_secret(pred.trajectory)


def test_the_argument_gate_in_litellm_and_llamaindex(srv):
    """``tool_argument_threshold``: a call whose G-NLL passes withheld for one argument value."""
    litellm = _litellm()
    from gnll.integrations.litellm import UncertaintyHandler

    handler = UncertaintyHandler(
        policy="refuse", threshold=100.0, tool_argument_threshold=1.0, server="gnll"
    )

    async def run():
        data = await handler.async_pre_call_hook(None, None, _request(srv), "completion")
        sent = {k: v for k, v in data.items() if k != "metadata"}
        return await handler.async_post_call_success_hook(data, None, await litellm.acompletion(**sent))

    out = asyncio.run(run())
    [call] = out.choices[0].uncertainty["tool_calls"]
    assert call["withheld"] and call["arguments_over_threshold"] == ["city"] and not call["abstain"]
    assert not out.choices[0].message.tool_calls
    ran: list = []
    llm = _llamaindex(srv, policy="refuse", threshold=100.0, tool_argument_threshold=1.0)
    answer = llm.predict_and_call([_weather_tool(ran)], user_msg=QUESTION)
    assert ran == [] and "withheld: get_weather" in answer.response
