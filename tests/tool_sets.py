"""Tool definitions (OpenAI ``tools`` entries) shared by the tool-call tests and the bench scripts.

The bench scripts, run as ``python bench/NAME.py``, add this folder to ``sys.path`` to import it.
The key order of each definition is part of it: the tool prompt lists the tools as JSON.
"""

from __future__ import annotations

from typing import Any

#: The smallest get_weather tool: one string argument, no description (the scripted tool tests).
GET_WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _calculator(description: str, number: str) -> dict[str, Any]:
    """``calculator(a, op, b)``, its operands of JSON Schema type ``number``."""
    return {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    "a": {"type": number},
                    "op": {"type": "string", "enum": ["+", "-", "*", "/"]},
                    "b": {"type": number},
                },
                "required": ["a", "op", "b"],
            },
        },
    }


#: get_weather and an integer calculator, described: the real-model serve tests
#: (tests/serving/test_serve_tools_model.py) and bench/tool_canonical.py.
WEATHER_AND_CALCULATOR: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    _calculator("Compute a op b", "integer"),
]

# The tool-call benchmark's tools (bench/tool_calls.py): every task offers all three.

#: The title of the encyclopedia article that answers a TriviaQA question.
LOOKUP: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look up the encyclopedia article whose title answers the question",
        "parameters": {
            "type": "object",
            "properties": {"title": {"type": "string", "description": "the answer"}},
            "required": ["title"],
        },
    },
}

#: One arithmetic operation on two numbers (a SVAMP problem's equation).
CALCULATOR = _calculator("Compute a op b for two numbers", "number")


def convert_tool(units: list[str]) -> dict[str, Any]:
    """A unit converter whose units are ``units`` (the benchmark's unit pairs)."""
    return {
        "type": "function",
        "function": {
            "name": "convert",
            "description": "Convert a quantity from one unit to another",
            "parameters": {
                "type": "object",
                "properties": {
                    "value": {"type": "number"},
                    "from_unit": {"type": "string", "enum": units},
                    "to_unit": {"type": "string", "enum": units},
                },
                "required": ["value", "from_unit", "to_unit"],
            },
        },
    }
