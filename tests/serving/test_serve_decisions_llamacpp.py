"""`/v1/decisions` through `gnll serve --upstream` in front of a real llama.cpp server
(llama-cpp-python on SmolLM2's GGUF, the session fixture): it cannot teacher-force, so a decision
request is refused in one line naming what is missing; with `"first_token": true` the answers come
from the server's first-token alternatives and say so."""

from __future__ import annotations

import openai
import pytest

from gnll.serving import ServeSettings, build_proxy_app
from gnll.serving.server import ServerThread

pytestmark = pytest.mark.server

QUESTIONS = [
    {"type": "predicate", "name": "paris", "instructions": "Is Paris the capital of France?"},
    {
        "type": "choice",
        "name": "city",
        "instructions": "Which city is the capital of France?",
        "choices": [{"value": "Paris"}, {"value": "Lyon"}],
    },
]


def test_llamacpp_upstream_is_refused_or_answered_from_first_tokens_when_asked(llama_server):
    with ServerThread(build_proxy_app(llama_server.base_url, ServeSettings(api_key=None))) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0, timeout=300)
        with pytest.raises(openai.BadRequestError) as err:
            client.decisions.create(
                model="smollm2-135m-instruct", input="France.", questions=QUESTIONS
            )
        message = err.value.body["message"]
        assert "cannot teacher-force" in message and "first_token" in message
        assert "\n" not in message and err.value.body["code"] == "cannot_teacher_force"
        d = client.decisions.create(
            model="smollm2-135m-instruct",
            input="France.",
            questions=QUESTIONS,
            extra_body={"first_token": True},
        )
    assert [a.model_extra["method"] for a in d.answers] == ["first-token", "first-token"]
    answered = [a for a in d.answers if a.type != "refusal"]
    assert answered, [a.model_extra.get("reason") for a in d.answers]
    for a in answered:
        probs = [o["probability"] for o in a.model_dump()["probabilities"]]
        assert abs(sum(probs) - 1) <= 1e-9  # same path: float64 renormalisation
