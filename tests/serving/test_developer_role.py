"""The ``developer`` role is rendered as ``system`` everywhere, as OpenAI and vLLM do; tool-call
fields stay in the history.

OpenAI's SDKs send ``developer`` for instructions. Before, the in-process renderers passed it to
the chat template literally (SmolLM2's template then added its own default system turn and a
``developer`` turn), so the same messages got another answer in-process (G-NLL 1.17) than through
vLLM (18.27). A tiny random Llama with a ChatML template (tests/conftest.py) stands in for SmolLM2.
"""

from __future__ import annotations

import httpx
import pytest

from gnll import load_model, score
from gnll.backends.base import BATCH_INVARIANCE_ATOL, ChatPrompt
from gnll.backends.hf.tokenizer_side import TokenizerSide
from gnll.serving import ServeSettings, build_inprocess_app
from gnll.serving.schemas import ChatCompletionRequest, chat_prompt
from gnll.serving.server import ServerThread

DEV = [
    {"role": "developer", "content": "Answer briefly."},
    {"role": "user", "content": "What is the capital of France?"},
]
SYS = [{**DEV[0], "role": "system"}, DEV[1]]


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    return load_model(str(tiny_llama()), progress=False, chat_template=True)


def test_every_renderer_takes_developer_as_system(tiny):
    system = tiny.render_chat(SYS)
    assert "<|im_start|>system\nAnswer briefly." in system
    assert tiny.render_chat(DEV) == system
    assert tiny.render_prompt(ChatPrompt.of(DEV)) == system
    assert TokenizerSide.from_model(tiny).render_chat(DEV) == system  # distributed scoring
    req = ChatCompletionRequest(messages=DEV)
    assert tiny.render_prompt(chat_prompt(req.messages)) == system  # gnll serve


def test_score_messages_rows_give_the_systems_number(tiny):
    dev, sys_ = score(tiny, [DEV, SYS], ["Paris", "Paris"])
    assert dev.nll == pytest.approx(sys_.nll, abs=BATCH_INVARIANCE_ATOL)


def test_serve_answers_developer_as_system(tiny):
    with ServerThread(build_inprocess_app(tiny, ServeSettings(), max_wait_ms=1)) as srv:
        out = []
        for messages in (DEV, SYS):
            body = {"messages": messages, "max_tokens": 8}
            r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            out.append(r.json()["choices"][0])
    assert out[0]["message"]["content"] == out[1]["message"]["content"]
    g = [o["uncertainty"]["g_nll"] for o in out]
    assert g[0] == pytest.approx(g[1], abs=BATCH_INVARIANCE_ATOL)


def test_tool_call_history_is_kept_for_the_template():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    req = ChatCompletionRequest(
        messages=[
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ]
    )
    turns = chat_prompt(req.messages).messages
    assert turns[1]["tool_calls"] == [call] and turns[2]["tool_call_id"] == "c1"
