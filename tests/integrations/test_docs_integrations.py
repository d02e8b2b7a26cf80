"""docs/integrations.md's tool-call example, executed as a user would paste it: against the real
in-process ``gnll serve`` (the scripted tool-calling model of tool_helpers), with the page's
``tools`` list being the test's tools. It prints each call's record as the page says, and the
page's claim that ``message.tool_calls`` holds only the calls not withheld holds both ways."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
from integration_helpers import require
from tool_helpers import TOOLS, agent_server, server_record

pytestmark = [pytest.mark.integration]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)


def _run(block: str, url: str) -> tuple[dict, list[str]]:
    """The block run in a fresh namespace; what it printed, a line each."""
    # the page's server and model are the test server's (its scripted model is called "agent")
    code = block.replace("http://127.0.0.1:8000", url)
    code = code.replace('model="smollm2-135m-instruct"', 'model="agent"')
    assert code.count(url) == 1 and code.count('model="agent"') == 1, "the example changed"
    namespace: dict = {"tools": TOOLS}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(PAGE), "exec"), namespace)  # noqa: S102 - the page's own code
    return namespace, out.getvalue().splitlines()


def test_the_page_has_one_python_example_and_it_is_langchain():
    blocks = _python_blocks()
    assert len(blocks) == 1 and "bind_tools(tools)" in blocks[0]


@pytest.mark.parametrize("argument_threshold", ["3.0", "2.0"])
def test_the_langchain_tool_example_prints_each_calls_record(argument_threshold):
    require("langchain_openai")
    [block] = _python_blocks()
    assert "tool_argument_threshold=3.0" in block
    block = block.replace(
        "tool_argument_threshold=3.0", f"tool_argument_threshold={argument_threshold}"
    )
    with agent_server() as srv:
        [ref] = server_record(srv)["tool_calls"]
        namespace, lines = _run(block, srv.url)
    [line] = lines
    name, g_nll, least, withheld = line.split(" ")
    assert name == "get_weather" and least == ref["least_certain_argument"] == "city"
    assert abs(float(g_nll) - ref["g_nll"]) <= 1e-6  # same path: the server's log-probs re-read
    [arg] = ref["arguments"]
    expect_withheld = ref["g_nll"] > 8.0 or arg["nll"] > float(argument_threshold)
    assert withheld == str(expect_withheld)
    assert expect_withheld is (argument_threshold == "2.0")  # the argument's NLL is 3
    # "message.tool_calls holds only calls that were not withheld"
    calls = namespace["message"].tool_calls
    assert [c["name"] for c in calls] == ([] if expect_withheld else ["get_weather"])
