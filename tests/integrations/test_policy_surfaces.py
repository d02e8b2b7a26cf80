"""Every surface obeys the one policy (:mod:`gnll.policy`): under ``refuse`` no byte of a refused
answer reaches the caller before the refusal (here: none at all), streamed or not.

The surfaces: ``gnll serve`` in-process (a stand-in streaming model) and as a proxy, LangChain,
LiteLLM (its streaming hook on the SDK's stream), LlamaIndex ``stream_chat`` and
``stream_complete``, and DSPy, each in front of the recorded vLLM server answering in the
ChatAdapter's format with a field value ("Lyon") whose G-NLL is far above the threshold. Before the
policy left the server, LlamaIndex ``stream_chat`` sent the refused text first and
``stream_complete`` neither scored nor refused.

Tool calls: the same surfaces in front of ``gnll serve`` on a scripted model that calls
``get_weather(city="Lyon")`` (tool_helpers.AgentModel), the call's G-NLL above the threshold: the
withheld call's argument reaches no caller and no tool runs."""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest
from fastapi.testclient import TestClient
from integration_helpers import require, vllm_app, vllm_chat_answer
from serve_helpers import StreamingModel
from tool_helpers import QUESTION as TOOL_QUESTION
from tool_helpers import SECRET as TOOL_SECRET
from tool_helpers import TOOLS, agent_server

from gnll.policy import DEFAULT_REFUSAL, AbstentionPolicy
from gnll.serving import ServeSettings, build_inprocess_app, build_proxy_app
from gnll.serving.server import ServerThread

pytestmark = [pytest.mark.integration]

SECRET = "Lyon"  # the refused answer's value: it must never reach the caller
TOKENS = ["[[", " ##", " answer", " ##", " ]]", "\n", SECRET, "\n\n", "[[", " ##", " completed"]
TOKENS += [" ##", " ]]"]
LOGPROBS = [-0.01] * 6 + [-9.0] + [-0.01] * 6
THRESHOLD = 1.0
QUESTION = [{"role": "user", "content": "Which city?"}]


def _text(obj) -> str:
    """Everything a caller can read of what it received, as text."""
    dump = getattr(obj, "model_dump", None)
    if dump is not None:
        obj = dump()
    return json.dumps(obj, default=repr)


def _serve_inprocess(vllm_url: str) -> list[str]:
    # the stand-in model's answer to "unsure" is "Maybe Lyon" (G-NLL 5)
    policy = AbstentionPolicy(mode="refuse", threshold=THRESHOLD)
    app = build_inprocess_app(StreamingModel(), ServeSettings(policy=policy), max_wait_ms=1)
    body = {"model": "streaming", "prompt": "unsure", "max_tokens": 8, "stream": True}
    with TestClient(app) as client, client.stream("POST", "/v1/completions", json=body) as r:
        return [line for line in r.iter_lines() if line]


def _serve_proxy(vllm_url: str) -> list[str]:
    policy = AbstentionPolicy(mode="refuse", threshold=THRESHOLD)
    app = build_proxy_app(vllm_url + "/v1", ServeSettings(policy=policy), server="vllm")
    body = {"model": "served-model", "messages": QUESTION, "stream": True}
    with ServerThread(app) as proxy, httpx.stream(
        "POST", proxy.url + "/v1/chat/completions", json=body, timeout=60
    ) as r:
        return [line for line in r.iter_lines() if line]


def _langchain(vllm_url: str) -> list[str]:
    require("langchain_openai")
    from langchain_openai import ChatOpenAI

    from gnll.integrations.langchain import with_uncertainty

    chat = ChatOpenAI(base_url=vllm_url + "/v1", api_key="x", model="served-model", max_retries=0)
    llm = with_uncertainty(chat, policy="refuse", threshold=THRESHOLD, server="vllm")
    return [_text(chunk) for chunk in llm.stream("Which city?")]


def _litellm(vllm_url: str) -> list[str]:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = require("litellm")
    from gnll.integrations.litellm import UncertaintyHandler

    handler = UncertaintyHandler(policy="refuse", threshold=THRESHOLD, server="vllm")

    async def run() -> list[str]:
        data = {"model": "hosted_vllm/served-model", "messages": QUESTION, "stream": True}
        data = await handler.async_pre_call_hook(None, None, data, "completion")
        sent = {k: v for k, v in data.items() if k != "metadata"}
        stream = await litellm.acompletion(api_base=vllm_url + "/v1", api_key="x", **sent)
        hook = handler.async_post_call_streaming_iterator_hook(None, stream, data)
        return [_text(chunk) async for chunk in hook]

    return asyncio.run(run())


def _llamaindex_llm(vllm_url: str):
    require("llama_index.llms.openai_like")
    from llama_index.llms.openai_like import OpenAILike

    from gnll.integrations.llamaindex import with_uncertainty

    llm = OpenAILike(
        model="served-model", api_base=vllm_url + "/v1", api_key="x", is_chat_model=True
    )
    return with_uncertainty(llm, policy="refuse", threshold=THRESHOLD, server="vllm")


def _seen(response) -> str:
    """What a LlamaIndex caller reads of one streamed response."""
    message = getattr(response, "message", None)
    parts = {
        "text": getattr(response, "text", None),
        "content": getattr(message, "content", None),
        "delta": getattr(response, "delta", None),
        "raw": response.raw,
        "logprobs": response.logprobs,
        "additional_kwargs": response.additional_kwargs,
    }
    return _text(parts)


def _llamaindex_stream_chat(vllm_url: str) -> list[str]:
    from llama_index.core.llms import ChatMessage

    llm = _llamaindex_llm(vllm_url)
    return [_seen(r) for r in llm.stream_chat([ChatMessage(role="user", content="Which city?")])]


def _llamaindex_stream_complete(vllm_url: str) -> list[str]:
    return [_seen(r) for r in _llamaindex_llm(vllm_url).stream_complete("Which city?")]


def _dspy(vllm_url: str) -> list[str]:
    dspy = require("dspy")
    from gnll.integrations.dspy import FieldConfidence

    lm = dspy.LM("hosted_vllm/served-model", api_base=vllm_url + "/v1", api_key="x", cache=False)
    qa = FieldConfidence("question -> answer", policy="refuse", threshold=THRESHOLD, server="vllm")
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = qa(question="Which city?")
    completions = getattr(pred, "_completions", None)
    return [_text({**pred.toDict(), "uncertainty": pred.uncertainty}), repr(completions)]


SURFACES = {
    "serve-inprocess": _serve_inprocess,
    "serve-proxy": _serve_proxy,
    "langchain": _langchain,
    "litellm": _litellm,
    "llamaindex-stream_chat": _llamaindex_stream_chat,
    "llamaindex-stream_complete": _llamaindex_stream_complete,
    "dspy": _dspy,
}


@pytest.fixture(scope="module")
def vllm_url():
    """The recorded vLLM server, answering every chat request with the uncertain answer."""
    answer = vllm_chat_answer(TOKENS, LOGPROBS, eos=-0.05)
    with ServerThread(vllm_app(answer)) as vllm:
        yield vllm.url


@pytest.mark.parametrize("surface", list(SURFACES))
def test_no_byte_of_a_refused_answer_reaches_the_caller(surface, vllm_url):
    received = SURFACES[surface](vllm_url)
    assert received, "the surface sent nothing"
    everything = "\n".join(received)
    refusal_at = everything.find(DEFAULT_REFUSAL)
    assert refusal_at >= 0, f"{surface} sent no refusal: {everything[:500]}"
    assert SECRET not in everything[:refusal_at], f"{surface} leaked before the refusal"
    assert SECRET not in everything, f"{surface} sent the refused answer: {everything[:800]}"


def test_the_observing_handlers_refuse_a_withholding_policy():
    """LangChain's callback and LlamaIndex's event handler see an answer after the caller: under
    refuse they would change a response already delivered (LlamaIndex's did), so they refuse it."""
    require("llama_index.core")
    require("langchain_core")
    from gnll._util.validation import ParameterError
    from gnll.integrations.langchain import UncertaintyCallbackHandler
    from gnll.integrations.llamaindex import UncertaintyEventHandler

    for handler in (UncertaintyCallbackHandler, UncertaintyEventHandler):
        with pytest.raises(ParameterError, match="a callback only observes"):
            handler(policy="refuse", threshold=THRESHOLD)
        assert handler(policy="flag", threshold=THRESHOLD).scorer.policy.mode == "flag"


# ---------------------------------------------------------------------------------- tool calls
def _tools_serve_inprocess(url: str, ran: list) -> list[str]:
    policy = AbstentionPolicy(mode="refuse", threshold=THRESHOLD)
    with agent_server(policy) as srv:
        out = []
        for stream in (False, True):
            body = {"model": "agent", "messages": [{"role": "user", "content": TOOL_QUESTION}]}
            body |= {"tools": TOOLS, "stream": stream, "logprobs": True}
            with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body) as r:
                out += [line for line in r.iter_lines() if line]
        return out


def _tools_langchain(url: str, ran: list) -> list[str]:
    require("langchain_openai")
    from langchain_openai import ChatOpenAI

    from gnll.integrations.langchain import with_uncertainty

    chat = ChatOpenAI(base_url=url + "/v1", api_key="x", model="agent", max_retries=0)
    llm = with_uncertainty(chat, policy="refuse", threshold=THRESHOLD, server="gnll")
    llm = llm.bind_tools(TOOLS)
    out = [_text(llm.invoke(TOOL_QUESTION))]
    return out + [_text(chunk) for chunk in llm.stream(TOOL_QUESTION)]


def _tools_litellm(url: str, ran: list) -> list[str]:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = require("litellm")
    from gnll.integrations.litellm import UncertaintyHandler

    handler = UncertaintyHandler(policy="refuse", threshold=THRESHOLD, server="gnll")

    async def run(stream: bool) -> list[str]:
        data = {
            "model": "openai/agent",
            "messages": [{"role": "user", "content": TOOL_QUESTION}],
            "tools": TOOLS,
            "stream": stream,
        }
        data = await handler.async_pre_call_hook(None, None, data, "completion")
        sent = {k: v for k, v in data.items() if k != "metadata"}
        response = await litellm.acompletion(api_base=url + "/v1", api_key="x", **sent)
        if not stream:
            return [_text(await handler.async_post_call_success_hook(data, None, response))]
        hook = handler.async_post_call_streaming_iterator_hook(None, response, data)
        return [_text(chunk) async for chunk in hook]

    return asyncio.run(run(False)) + asyncio.run(run(True))


def _tools_llamaindex(url: str, ran: list) -> list[str]:
    require("llama_index.llms.openai_like")
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.openai_like import OpenAILike

    from gnll.integrations.llamaindex import with_uncertainty

    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"Sunny in {city}."

    tool = FunctionTool.from_defaults(fn=get_weather)
    llm = OpenAILike(
        model="agent",
        api_base=url + "/v1",
        api_key="x",
        is_chat_model=True,
        is_function_calling_model=True,
    )
    llm = with_uncertainty(llm, policy="refuse", threshold=THRESHOLD, server="gnll")
    out = [_text({"response": llm.predict_and_call([tool], user_msg=TOOL_QUESTION).response})]
    return out + [_seen(r) for r in llm.stream_chat_with_tools([tool], user_msg=TOOL_QUESTION)]


def _tools_dspy(url: str, ran: list) -> list[str]:
    dspy = require("dspy")
    from gnll.integrations.dspy import with_tool_uncertainty

    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"Sunny in {city}."

    lm = dspy.LM("openai/agent", api_base=url + "/v1", api_key="x", cache=False)
    agent = with_tool_uncertainty(
        dspy.ReAct("question -> answer", tools=[get_weather], max_iters=3),
        policy="refuse",
        threshold=THRESHOLD,
        server="gnll",
    )
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        pred = agent(question=TOOL_QUESTION)
    return [_text(pred.toDict()), _text(agent.react.records)]


TOOL_SURFACES = {
    "serve-inprocess": _tools_serve_inprocess,
    "langchain": _tools_langchain,
    "litellm": _tools_litellm,
    "llamaindex": _tools_llamaindex,
    "dspy": _tools_dspy,
}


@pytest.fixture(scope="module")
def agent_url():
    """``gnll serve`` (annotate) on the scripted tool-calling model: the integrations decide."""
    with agent_server() as srv:
        yield srv.url


@pytest.mark.parametrize("surface", list(TOOL_SURFACES))
def test_no_byte_of_a_withheld_tool_call_reaches_the_caller_and_no_tool_runs(surface, agent_url):
    ran: list = []
    received = TOOL_SURFACES[surface](agent_url, ran)
    assert received, "the surface sent nothing"
    everything = "\n".join(received)
    assert ran == [], f"{surface} ran the withheld call's tool"
    assert "The tool call was withheld: get_weather" in everything, everything[:500]
    assert TOOL_SECRET not in everything, f"{surface} sent the withheld call: {everything[:800]}"
