"""A tool-calling stand-in behind the real in-process ``gnll serve``, for the framework tests of tool
calls (tests/integrations/test_tool_calls.py, test_policy_surfaces.py).

:class:`AgentModel` is a scripted model (no weights) that answers by what the prompt asks for: the
documented ``<tool_call>`` block when the prompt lists tools (OpenAI ``tools``), DSPy ReAct's
field format for a ReAct step (a call of ``get_weather``, then ``finish`` once the trajectory has
an observation), and the ReAct extraction's fields. Every answer's argument value is
:data:`SECRET`, whose one token has a low log-prob, so that a policy withholds the call."""

from __future__ import annotations

import contextlib
import re

import openai
from serve_helpers import ScriptedModel

from gnll.backends.base import Generation
from gnll.policy import AbstentionPolicy
from gnll.serving import ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread

SECRET = "Lyon"  # the called tool's argument value: never in the question
SECRET_LOGPROB = -3.0
QUESTION = "What is the weather in the city I live in?"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "' + SECRET + '"}}\n</tool_call>'
)
REACT_CALL = (
    "[[ ## next_thought ## ]]\nI look the weather up.\n\n[[ ## next_tool_name ## ]]\n"
    "get_weather\n\n[[ ## next_tool_args ## ]]\n"
    '{"city": "' + SECRET + '"}\n\n[[ ## completed ## ]]'
)
REACT_FINISH = (
    "[[ ## next_thought ## ]]\nDone.\n\n[[ ## next_tool_name ## ]]\nfinish\n\n"
    "[[ ## next_tool_args ## ]]\n{}\n\n[[ ## completed ## ]]"
)
EXTRACT = "[[ ## reasoning ## ]]\nIt said so.\n\n[[ ## answer ## ]]\nSunny\n\n[[ ## completed ## ]]"


def tokens_of(text: str) -> tuple[list[str], list[float]]:
    """``text`` as word, space and punctuation tokens; log-prob -0.05 each, the secret's lower."""
    tokens = re.findall(r"\w+|\s+|[^\w\s]+", text)
    assert "".join(tokens) == text
    return tokens, [SECRET_LOGPROB if t == SECRET else -0.05 for t in tokens]


def answer_for(prompt: str) -> str:
    if "[[ ## reasoning ## ]]" in prompt:
        return EXTRACT
    if "next_tool_name" in prompt:
        return REACT_FINISH if "observation_0" in prompt else REACT_CALL
    if "<tools>" in prompt:
        return CALL
    return "I do not know."


class AgentModel(ScriptedModel):
    """Calls ``get_weather(city=SECRET)`` in whichever format the prompt asks for (the module)."""

    name = "agent"

    def generate(self, prompts, config=None, **kwargs):
        with self.lock:
            self.prompts.extend(prompts)
        out = []
        for p in prompts:
            tokens, lps = tokens_of(answer_for(str(p)))
            out.append([Generation("".join(tokens), list(range(len(tokens))), tokens, lps, "eos")])
        return out


@contextlib.contextmanager
def agent_server(policy: AbstentionPolicy | None = None):
    """``gnll serve`` in-process around :class:`AgentModel` (``srv.url``, ``srv.client``)."""
    settings = ServeSettings(policy=policy) if policy is not None else ServeSettings()
    with ServerThread(build_inprocess_app(AgentModel(), settings, max_wait_ms=1)) as srv:
        srv.client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        yield srv


def server_record(srv, **kw) -> dict:
    """The server's own record of the call (the reference an integration's numbers equal)."""
    r = srv.client.chat.completions.create(
        model="agent",
        messages=[{"role": "user", "content": QUESTION}],
        tools=TOOLS,
        logprobs=True,
        temperature=0,
        **kw,
    )
    return r.choices[0].uncertainty
