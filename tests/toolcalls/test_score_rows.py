"""``gnll score`` rows whose answer is a tool call or a JSON object (no model: the row checks)."""

from __future__ import annotations

import json

from gnll.scoring.rows import Item, structured_answer, to_item
from gnll.toolcalls import parse_output

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


def _item(answer, **row):
    item = to_item(
        1,
        {"messages": MESSAGES, "answer": answer, **row},
        long=False,
        render_messages=lambda m: json.dumps(m),
        raw_prompt=False,
    )
    assert isinstance(item, Item), item
    return item


def test_a_tool_call_answer_is_scored_as_the_documented_call_after_the_tool_prompt():
    for answer in (
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
        {
            "role": "assistant",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
    ):
        item = _item(answer, tools=TOOLS)
        assert item.tool_names == ["get_weather"]
        [call] = parse_output(item.answer, item.tool_names).calls
        assert (call.name, call.arguments) == ("get_weather", {"city": "Paris"})
        assert "<tools>" in item.prompt and "get_weather" in item.prompt  # the tool prompt
        assert item.row["messages"] == MESSAGES  # the output row keeps the row as given


def test_a_json_object_answer_is_its_text_and_no_call():
    item = _item({"capital": "Paris"})
    assert item.answer == '{"capital": "Paris"}' and item.tool_names is None
    assert structured_answer([1, 2]) == ([1, 2], None)
    bad = to_item(
        1,
        {"messages": MESSAGES, "answer": [1, 2]},
        long=False,
        render_messages=json.dumps,
        raw_prompt=False,
    )
    assert bad == "field 'answer' must be a string, got list"
