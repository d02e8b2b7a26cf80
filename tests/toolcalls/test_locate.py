"""Finding the calls a server's tool parser returned in the output its log-probs spell
(:func:`gnll.toolcalls.locate_calls`, :func:`gnll.policy.choices.tool_choice_answer`), and the
documented tool prompt as a server's chat template (:func:`gnll.toolcalls.tool_chat_template`)."""

from __future__ import annotations

import json

import pytest
from transformers.utils.chat_template_utils import _compile_jinja_template

from gnll.backends.base import GenerationConfig
from gnll.measures import LogprobError
from gnll.policy.choices import tool_choice_answer
from gnll.serving.protocol.tools import ToolRequest
from gnll.serving.schemas import ChatCompletionRequest
from gnll.serving.tools import render_messages
from gnll.toolcalls import call_report, locate_calls, parse_output, tool_chat_template

OUT = (
    'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    '</tool_call>\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 2"}}\n'
    "</tool_call>"
)


def test_located_calls_are_the_parsed_ones():
    """Where the documented parser reads the calls, locating the server's calls gives the same
    parts (so proxy and in-process records agree)."""
    parsed = parse_output(OUT, ["get_weather", "calculator"]).calls
    # a parser that re-serialises the arguments (vLLM's hermes: json.dumps) still matches
    located = locate_calls(
        OUT, [("get_weather", '{"city":"Paris"}'), ("calculator", {"expression": "2 + 2"})]
    )
    assert located == parsed


def test_llama3_parameters_and_bare_arguments():
    out = '{"name": "f", "parameters": {"x": [1, 2]}}'
    [c] = locate_calls(out, [("f", '{"x": [1, 2]}')])
    assert [s.path for s in c.argument_segments] == ["x[0]", "x[1]"]
    bare = 'noise {"x": 3}'
    [c] = locate_calls(bare, [("f", {"x": 3})])
    assert c.name == "f" and c.name_segment.start == c.name_segment.end  # the name has no tokens
    assert bare[c.start : c.end] == '{"x": 3}'


def test_a_call_not_in_the_output_is_named():
    with pytest.raises(ValueError, match=r"tool call 1 \(calculator\) is not in the output"):
        locate_calls(OUT, [("get_weather", {"city": "Paris"}), ("calculator", {"expression": "3"})])
    # the order counts: the calls are found one after the other
    with pytest.raises(ValueError, match=r"tool call 1 \(get_weather\)"):
        locate_calls(
            OUT, [("calculator", {"expression": "2 + 2"}), ("get_weather", {"city": "Paris"})]
        )


def _choice(tokens, *, finish="tool_calls", stop=None, calls=None):
    return {
        "message": {"role": "assistant", "content": None, "tool_calls": calls},
        "logprobs": {
            "content": [
                {"token": t, "logprob": -0.1 * (k + 1), "bytes": list(t.encode())}
                for k, t in enumerate(tokens)
            ]
        },
        "finish_reason": finish,
        "stop_reason": stop,
    }


def test_tool_choice_answer_scores_the_whole_output_without_the_terminator():
    text = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    tokens = [text[i : i + 5] for i in range(0, len(text), 5)] + ["<|im_end|>"]
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    choice = _choice(tokens, calls=[call])
    cfg = GenerationConfig.greedy()
    answer, [located] = tool_choice_answer(choice, cfg, eos_logprob=True)
    assert answer.text == text and answer.tokens == tokens[:-1]  # the EOS token is the terminator
    [rec] = call_report(answer.tokens, answer.token_logprobs, answer.text, [located])
    assert rec["arguments"][0]["text"] == "1"
    parts = rec["name_tokens"] + rec["structure_tokens"] + rec["arguments"][0]["token_indices"]
    assert sorted(parts) == rec["token_indices"]
    # A server that drops the EOS token (llama.cpp) reports only the output.
    answer, _ = tool_choice_answer(_choice(tokens[:-1], calls=[call]), cfg, eos_logprob=False)
    assert answer.text == text
    # No log-probs content: the server must report the call's tokens.
    with pytest.raises(LogprobError, match="logprobs.content"):
        tool_choice_answer({**choice, "logprobs": None}, cfg, eos_logprob=True)
    bad = {**call, "function": {"name": "f", "arguments": '{"x": 2}'}}
    with pytest.raises(LogprobError, match=r"tool call 0 \(f\)"):
        tool_choice_answer(_choice(tokens, calls=[bad]), cfg, eos_logprob=True)


#: SmolLM2-135M-Instruct's chat template (ChatML with a default system message).
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"q": {"description": "ünï"}}},
        },
    },
]
CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'},
        }
    ],
}
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    [
        {"role": "user", "content": "What is 2+2?"},
        CALLED,
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
    ],
]


@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_the_tool_template_renders_what_gnll_renders_in_process(conversation):
    """What a server sees through the extended template (vLLM: tools with ``description: null``,
    earlier calls' arguments parsed) is the prompt in-process gnll renders; without tools, the
    model's own template's output, byte for byte."""
    own = _compile_jinja_template(SMOLLM2)
    extended = _compile_jinja_template(tool_chat_template(SMOLLM2))
    req = ChatCompletionRequest.model_validate({"messages": conversation, "tools": TOOLS})
    want = own.render(
        messages=render_messages(req, ToolRequest.of(req.model_extra or {})),
        add_generation_prompt=True,
    )
    served = json.loads(json.dumps(conversation))
    for m in served:
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    tools = [
        {"type": "function", "function": {"description": None, **t["function"]}} for t in TOOLS
    ]
    assert extended.render(messages=served, tools=tools, add_generation_prompt=True) == want
    plain = [m for m in conversation if m["role"] in ("system", "user")]
    assert extended.render(messages=plain, add_generation_prompt=True) == own.render(
        messages=plain, add_generation_prompt=True
    )
