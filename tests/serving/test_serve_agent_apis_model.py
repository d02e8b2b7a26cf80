"""The same question gets the same answer and G-NLL through chat completions, the Responses API and
the Messages API, on the real embedded model (a system prompt included), streamed or not."""

from __future__ import annotations

import anthropic
import openai
import pytest

from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.serving import ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread

pytestmark = pytest.mark.model

MODEL = "smollm2-135m-instruct"
SYSTEM = "Answer in one short sentence."
QUESTIONS = ["What is the capital of France?", "Who wrote Hamlet?"]


@pytest.fixture(scope="module")
def served(smollm):
    with ServerThread(build_inprocess_app(smollm, ServeSettings())) as srv:
        yield srv


def test_chat_responses_and_messages_give_the_same_g_nll(served):
    oc = openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=0, timeout=120)
    ac = anthropic.Anthropic(base_url=served.url, api_key="x", max_retries=0, timeout=120)
    for q in QUESTIONS:
        chat = oc.chat.completions.create(
            model=MODEL,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            max_tokens=16,
        ).choices[0]
        g = chat.uncertainty["g_nll"]
        resp = oc.responses.create(model=MODEL, instructions=SYSTEM, input=q, max_output_tokens=16)
        with oc.responses.stream(
            model=MODEL, instructions=SYSTEM, input=q, max_output_tokens=16
        ) as stream:
            # a cut answer ends in response.incomplete, as OpenAI's does (no get_final_response)
            ends = ("response.completed", "response.incomplete")
            streamed = [e.response for e in stream if e.type in ends][0]
        user = [{"role": "user", "content": q}]
        msg = ac.messages.create(model=MODEL, system=SYSTEM, messages=user, max_tokens=16)
        with ac.messages.stream(model=MODEL, system=SYSTEM, messages=user, max_tokens=16) as s:
            record = [e.uncertainty for e in s if e.type == "message_delta"][0]
            text = s.get_final_message().content[0].text
        assert resp.output_text == streamed.output_text == chat.message.content
        assert msg.content[0].text == text == chat.message.content
        for other in (
            resp.output[0].uncertainty,
            streamed.output[0].uncertainty,
            msg.uncertainty,
            record,
        ):
            assert other["g_nll"] == pytest.approx(g, abs=BATCH_INVARIANCE_ATOL)
            assert other["num_tokens"] == chat.uncertainty["num_tokens"]
