"""The web page shows a tool call's least certain argument (its path and NLL, its tokens outlined)
and says when a call was withheld, without its text (headless Chromium, scripted model)."""

from __future__ import annotations

import json

import pytest
from serve_helpers import chromium
from test_serve_tools import TOKENS, TOOLS, CallingModel

from gnll.policy import AbstentionPolicy
from gnll.serving import ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread

pytestmark = pytest.mark.browser


def _ask(url: str, tools: str) -> dict:
    with chromium() as browser:
        page = browser.new_page()
        page.goto(url + "/")
        page.wait_for_function("document.getElementById('server-info').textContent.includes('·')")
        page.fill("#question", "Weather in Paris?")
        page.click("#tools-box summary")
        page.fill("#tools", tools)
        page.click("#ask")
        page.wait_for_selector("#answer[data-state=done]", timeout=60_000)
        return {
            "lines": page.locator("#tool-calls div").all_inner_texts(),
            "outlined": page.locator("#answer .tok.least-arg").all_inner_texts(),
            "answer": page.locator("#answer").inner_text(),
            "error": page.locator("#error").inner_text(),
        }


@pytest.mark.parametrize("gate", [False, True])
def test_page_shows_a_tool_calls_least_certain_argument(gate):
    settings = ServeSettings(
        policy=AbstentionPolicy(mode="refuse", threshold=100.0) if gate else AbstentionPolicy(),
        tool_argument_threshold=0.5 if gate else None,
    )
    with ServerThread(build_inprocess_app(CallingModel(), settings, max_wait_ms=1)) as srv:
        # the same request as the page, for the record's numbers
        import httpx

        body = {"model": "calling", "messages": [{"role": "user", "content": "Weather in Paris?"}]}
        rec = httpx.post(
            srv.url + "/v1/chat/completions", json={**body, "tools": TOOLS}, timeout=30
        ).json()["choices"][0]["uncertainty"]
        got = _ask(srv.url, json.dumps(TOOLS))
    [call] = rec["tool_calls"]
    [arg] = call["arguments"]
    assert not got["error"]
    [line] = got["lines"]
    assert line.startswith("tool call get_weather: G-NLL " + f"{call['g_nll']:.4f}")
    assert (
        f"least certain argument city — NLL {arg['nll']:.4f} over {arg['num_tokens']} tokens"
        in line
    )
    if gate:
        assert "withheld: the call never reached the client" in line
        assert "over the argument threshold: city" in line
        assert "Paris" not in got["answer"] and got["outlined"] == []
    else:
        assert "withheld" not in line
        # the argument's tokens are outlined: they spell the value
        assert got["outlined"] == [TOKENS[k] for k in arg["token_indices"]]
        assert "Paris" in "".join(got["outlined"])


def test_page_lists_the_local_models_withheld_call_after_an_escalation():
    from test_serve_tools_escalate import TOOLS as ESC_TOOLS
    from test_serve_tools_escalate import Caller, gated

    with gated(Caller("small", "Pariss", -1.5)) as srv:
        got = _ask(srv.url, json.dumps(ESC_TOOLS))
    assert not got["error"]
    [line] = [x for x in got["lines"] if x.startswith("the local model small's")]
    assert "tool call get_weather" in line and "least certain argument city" in line
    assert "withheld: the call never reached the client" in line
    assert "Pariss" not in got["answer"] and "Pariss" not in " ".join(got["lines"])
    # the larger model's call: its shaded tokens (the proxy scores it), or the call it sent
    assert "get_weather" in got["answer"] and '"Paris"' in got["answer"]
    [mine] = [x for x in got["lines"] if x.startswith("tool call get_weather")]
    assert "withheld" not in mine and "Paris" in "".join(got["outlined"])
