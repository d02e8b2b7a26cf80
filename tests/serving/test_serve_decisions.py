"""``POST /v1/decisions`` with the openai SDK (sync and async), in-process and through the proxy.

A tiny random-weight model serves in-process; the proxy's upstream is a vLLM-shaped stand-in that
computes with the same model (tests/vllm_standin.py), so the numbers through the proxy must equal
the in-process ones at the documented tolerance. An upstream that cannot teacher-force (a
llama.cpp-shaped stand-in) is refused in one line, or answered from first-token scores when asked.
"""

from __future__ import annotations

import asyncio

import numpy as np
import openai
import pytest
from decision_helpers import INPUT, QUESTIONS

from gnll import load_model
from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.scoring.decisions import decide
from gnll.serving import ServeSettings, build_inprocess_app, build_proxy_app
from gnll.serving.server import ServerThread


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    # a chat model, as vLLM serves one (the stand-in applies the template to chat requests)
    return load_model(str(tiny_llama()), progress=False, chat_template=True)


@pytest.fixture(scope="module")
def served(tiny):
    with ServerThread(build_inprocess_app(tiny, ServeSettings(api_key=None))) as srv:
        yield srv


def _client(url: str, cls=openai.OpenAI):
    return cls(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)


def _check_against_library(answers, reference) -> None:
    for got, ref in zip(answers, reference.answers, strict=True):
        assert got.type == ref.type
        probs = got.model_extra["probabilities"] if got.type == "predicate" else got.probabilities
        p = [o["probability"] if isinstance(o, dict) else o.probability for o in probs]
        assert abs(sum(p) - 1.0) <= 1e-9  # same path: float64 normalisation
        nll = [(o if isinstance(o, dict) else o.model_extra)["nll"] for o in probs]
        assert np.allclose(nll, [o.nll for o in ref.options], atol=BATCH_INVARIANCE_ATOL)


def test_sdk_sync_in_process_equals_the_library(served, tiny):
    d = _client(served.url).decisions.create(model=tiny.name, input=INPUT, questions=QUESTIONS)
    assert [a.type for a in d.answers] == ["predicate", "choice", "score"]
    assert [a.name for a in d.answers] == ["late", "topic", "anger"]
    _check_against_library(d.answers, decide(tiny, INPUT, QUESTIONS))
    choice = d.answers[1]
    assert choice.choice in {"delivery delay", "delivery damage", "billing"}
    assert [o.value for o in choice.probabilities] == [
        "delivery delay",
        "delivery damage",
        "billing",
    ]
    # multi-token options sharing a first token still get different (exact) probabilities
    assert choice.probabilities[0].probability != choice.probabilities[1].probability
    score = d.answers[2]
    assert [o.value for o in score.probabilities] == [0, 1, 2]
    assert [o.label for o in score.probabilities] == ["Calm", "Annoyed", "Furious"]
    assert score.score == pytest.approx(sum(o.value * o.probability for o in score.probabilities))
    assert d.usage.input_tokens > 0 and d.usage.total_tokens == d.usage.input_tokens


def test_sdk_async_in_process(served, tiny):
    async def go():
        async with _client(served.url, openai.AsyncOpenAI) as client:
            return await asyncio.gather(
                *(
                    client.decisions.create(model=tiny.name, input=INPUT, questions=QUESTIONS)
                    for _ in range(3)
                )
            )

    outs = asyncio.run(go())
    first = [a.model_dump() for a in outs[0].answers]
    for d in outs[1:]:  # concurrent requests: the same numbers
        for a, b in zip(first, [a.model_dump() for a in d.answers], strict=True):
            assert a["type"] == b["type"]
            for x, y in zip(
                a.get("probabilities") or [], b.get("probabilities") or [], strict=True
            ):
                assert abs(x["probability"] - y["probability"]) <= 1e-4


def test_refusal_per_question_over_the_wire(served, tiny):
    qs = [
        QUESTIONS[0],
        {
            "type": "choice",
            "name": "photo",
            "instructions": [{"type": "input_image", "image_url": "https://example.com/a.png"}],
            "choices": [{"value": "cat"}, {"value": "dog"}],
        },
    ]
    d = _client(served.url).decisions.create(model=tiny.name, input=INPUT, questions=qs)
    assert [a.type for a in d.answers] == ["predicate", "refusal"]
    assert d.answers[1].name == "photo" and "image" in d.answers[1].model_extra["reason"]


def test_bad_request_and_wrong_model_are_openai_errors(served, tiny):
    client = _client(served.url)
    with pytest.raises(openai.BadRequestError, match="choices"):
        client.decisions.create(
            model=tiny.name,
            input=INPUT,
            questions=[{"type": "choice", "instructions": "x", "choices": [{"value": "a"}]}],
        )
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.decisions.create(model="gpt-6-luna", input=INPUT, questions=QUESTIONS)


def test_proxy_to_a_teacher_forcing_upstream_equals_in_process(tiny):
    from vllm_standin import vllm_standin

    with vllm_standin(tiny, "tiny") as upstream:
        with ServerThread(build_proxy_app(upstream.url, ServeSettings(api_key=None))) as proxy:
            d = _client(proxy.url).decisions.create(model="tiny", input=INPUT, questions=QUESTIONS)
        assert any(r[1] == "/tokenize" for r in upstream.requests)  # teacher-forced upstream
    assert [a.type for a in d.answers] == ["predicate", "choice", "score"]
    _check_against_library(d.answers, decide(tiny, INPUT, QUESTIONS))


def test_proxy_refuses_an_upstream_that_cannot_teacher_force(tiny):
    from vllm_standin import vllm_standin

    with (
        vllm_standin(tiny, "tiny", owned_by="llamacpp") as upstream,
        ServerThread(build_proxy_app(upstream.url, ServeSettings(api_key=None))) as proxy,
    ):
        client = _client(proxy.url)
        with pytest.raises(openai.BadRequestError) as err:
            client.decisions.create(model="tiny", input=INPUT, questions=QUESTIONS)
        message = err.value.body["message"]
        assert "llama.cpp" in message and "cannot teacher-force" in message and "\n" not in message
        assert err.value.body["code"] == "cannot_teacher_force"
        # only when asked: first-token scores, labelled so
        d = client.decisions.create(
            model="tiny", input=INPUT, questions=QUESTIONS, extra_body={"first_token": True}
        )
    for a in d.answers:  # random weights: an option's first token may be outside the top 20
        assert a.model_extra["method"] == "first-token"
        if a.type == "refusal":
            assert "top 20 alternatives" in a.model_extra["reason"]
        else:
            assert abs(sum(o["probability"] for o in a.model_dump()["probabilities"]) - 1) <= 1e-9  # same path: float64 normalisation
