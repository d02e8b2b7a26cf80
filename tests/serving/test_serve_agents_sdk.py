"""The OpenAI Agents SDK (``openai-agents``) runs an agent through ``gnll serve`` unchanged, on its
default model (the Responses API), and each step's uncertainty is readable: from the run's raw
responses and from a ``RunHooks.on_llm_end`` hook, streamed or not."""

from __future__ import annotations

import asyncio

import pytest
from agents import Agent, OpenAIResponsesModel, RunHooks, Runner, set_tracing_disabled
from openai import AsyncOpenAI
from serve_helpers import UNSURE, StreamingModel

from gnll.serving import ServeSettings, build_inprocess_app, create_app
from gnll.serving.proxy import ProxyService
from gnll.serving.server import ServerThread

set_tracing_disabled(True)  # the SDK's own tracing exports to OpenAI's servers


class StepUncertainty(RunHooks):
    """Collects each model step's records (what the docs show)."""

    def __init__(self) -> None:
        self.steps: list[list[dict]] = []

    async def on_llm_end(self, context, agent, response) -> None:
        self.steps.append([item.uncertainty for item in response.output])


@pytest.fixture(scope="module", params=["in-process", "proxy"])
def served(request):
    """``gnll serve`` in-process, or the proxy in front of it."""
    with ServerThread(build_inprocess_app(StreamingModel(), ServeSettings(), max_wait_ms=1)) as srv:
        if request.param == "in-process":
            yield srv
            return
        service = ProxyService(srv.url + "/v1", timeout=30)
        with ServerThread(create_app(service, ServeSettings())) as px:
            yield px


@pytest.fixture
def agent(served):
    """An agent on gnll serve (a client per test: an async client belongs to one event loop)."""
    client = AsyncOpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0, timeout=30)
    model = OpenAIResponsesModel(model="streaming", openai_client=client)
    return Agent(name="asker", instructions=None, model=model)


def test_an_agent_run_reports_each_steps_uncertainty(agent):
    hooks = StepUncertainty()
    result = Runner.run_sync(agent, "unsure", hooks=hooks)
    assert result.final_output == "".join(UNSURE[0])
    records = [item.uncertainty for step in result.raw_responses for item in step.output]
    assert [r["g_nll"] for r in records] == [pytest.approx(5.0)]
    assert hooks.steps == [records]


def test_a_streamed_agent_run_reports_each_steps_uncertainty(agent):
    async def run() -> tuple[str, list[str], list[dict]]:
        hooks = StepUncertainty()
        result = Runner.run_streamed(agent, "unsure", hooks=hooks)
        deltas = [
            ev.data.delta
            async for ev in result.stream_events()
            if ev.type == "raw_response_event" and ev.data.type == "response.output_text.delta"
        ]
        assert hooks.steps == [[i.uncertainty for i in r.output] for r in result.raw_responses]
        return result.final_output, deltas, hooks.steps[0]

    final, deltas, records = asyncio.run(run())
    assert final == "".join(deltas) == "".join(UNSURE[0])
    assert records[0]["g_nll"] == pytest.approx(5.0)
