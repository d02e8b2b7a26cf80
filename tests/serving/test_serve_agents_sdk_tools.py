"""An OpenAI Agents SDK agent with one function tool, through ``gnll serve`` on the real embedded
model: the model's call (decoded under the tool grammar: ``tool_choice="required"``) comes back as a
``function_call`` item with its uncertainty, the tool runs, the agent answers, and every step's
uncertainty is readable from a run hook."""

from __future__ import annotations

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    RunHooks,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from gnll.serving import ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread

pytestmark = pytest.mark.model

set_tracing_disabled(True)


class Steps(RunHooks):
    def __init__(self) -> None:
        self.steps: list[list[tuple[str, dict]]] = []

    async def on_llm_end(self, context, agent, response) -> None:
        self.steps.append([(item.type, item.uncertainty) for item in response.output])


def test_an_agent_with_a_tool_completes_and_reports_each_step(smollm):
    asked: list[str] = []

    @function_tool
    def capital_of(country: str) -> str:
        """The capital city of a country."""
        asked.append(country)
        return "Paris"

    with ServerThread(build_inprocess_app(smollm, ServeSettings())) as srv:
        client = AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=300)
        agent = Agent(
            name="geo",
            instructions="Use the tool, then answer in one sentence.",
            model=OpenAIResponsesModel(model=smollm.name, openai_client=client),
            tools=[capital_of],
            model_settings=ModelSettings(tool_choice="required", max_tokens=120),
        )
        hooks = Steps()
        result = Runner.run_sync(agent, "What is the capital of France?", hooks=hooks, max_turns=4)
    assert asked, "the tool never ran"
    first = hooks.steps[0]
    assert [kind for kind, _ in first] == ["function_call"] * len(first)
    assert all(rec["g_nll"] is not None and rec["g_nll"] >= 0 for _, rec in first)
    assert isinstance(result.final_output, str) and result.final_output
    assert len(hooks.steps) >= 2 and all(rec is not None for step in hooks.steps for _, rec in step)
