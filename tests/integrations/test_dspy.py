"""DSPy: `FieldConfidence` through the real `dspy.Predict` and `dspy.LM`, against `gnll serve`.

The model is a scripted stand-in behind the real server (the embedded 135M model does not follow
DSPy's output format): it writes the ChatAdapter's field markers or the JSONAdapter's object with
known log-probs, so the field's score can be checked against gnll.spans by hand."""

from __future__ import annotations

import pytest
from integration_helpers import proxy_record, require, vllm_and_proxy, vllm_chat_answer

from gnll.backends.base import Generation
from gnll.serving import ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread
from gnll.spans import span_nlls

dspy = require("dspy")
from serve_helpers import ScriptedModel  # noqa: E402

from gnll.integrations.dspy import FieldConfidence  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.server]

CHAT = (
    [
        "[[",
        " ##",
        " answer",
        " ##",
        " ]]",
        "\n",
        "Par",
        "is",
        "\n\n",
        "[[",
        " ##",
        " completed",
        " ##",
        " ]]",
    ],
    [-0.01, -0.02, -0.03, -0.01, -0.02, -0.05, -0.7, -0.2, -0.1, -0.01, -0.02, -0.03, -0.01, -0.02],
)
JSON = (
    ['{"', "answer", '":', ' "', "Par", "is", '"}'],
    [-0.3, -0.02, -0.01, -0.04, -0.9, -0.1, -0.05],
)


class FieldModel(ScriptedModel):
    """Answers every prompt with one scripted completion."""

    def __init__(self, script):
        super().__init__()
        self.script = script

    def generate(self, prompts, config=None, **kwargs):
        tokens, lps = self.script
        return [
            [Generation("".join(tokens), list(range(len(tokens))), list(tokens), list(lps), "eos")]
            for _ in prompts
        ]


def lm(url):
    return dspy.LM("openai/scripted", api_base=url + "/v1", api_key="x", cache=False)


@pytest.mark.parametrize(
    "script, adapter, kind",
    [(CHAT, "ChatAdapter", "markers"), (JSON, "JSONAdapter", "json")],
)
def test_field_score_is_the_fields_span_nll(script, adapter, kind):
    with (
        ServerThread(
            build_inprocess_app(FieldModel(script), ServeSettings(), max_wait_ms=1)
        ) as srv,
        dspy.context(lm=lm(srv.url), adapter=getattr(dspy, adapter)()),
    ):
        pred = FieldConfidence("question -> answer", server="gnll", threshold=0.5)(
            question="What is the capital of France?"
        )
    tokens, lps = script
    text = "".join(tokens)
    if kind == "json":
        ref = next(s for s in span_nlls(tokens, lps, text, "json").spans if s.path == "$.answer")
        expected = ref.nll
    else:
        expected = -(lps[6] + lps[7])  # "Par", "is": the markers and newlines are not the field's
    assert pred.answer == "Paris"
    assert abs(pred.g_nll - expected) <= 1e-9  # same path: float64 sums of the log-probs the server sent
    assert pred.g_nll < -sum(lps)  # less than the whole completion's NLL
    assert pred.uncertainty["num_tokens"] == 2 and pred.uncertainty["abstain"] is True
    assert abs(pred.uncertainty["completion_nll"] - (-sum(lps))) <= 1e-9  # same path: float64 sums of the log-probs the server sent


def test_refuse_replaces_the_field():
    app = build_inprocess_app(FieldModel(CHAT), ServeSettings(), max_wait_ms=1)
    with ServerThread(app) as srv, dspy.context(lm=lm(srv.url), adapter=dspy.ChatAdapter()):
        pred = FieldConfidence("question -> answer", server="gnll", policy="refuse", threshold=0.5)(
            question="What is the capital of France?"
        )
    assert pred.answer == "I am not confident enough to answer this."
    assert pred.uncertainty["refused"] is True


@pytest.mark.model
def test_embedded_model_field_score_matches_the_servers_tokens(smollm):
    """The embedded model through the real `dspy.LM` (two demonstrations teach it the format): the
    whole completion's NLL is the server's `uncertainty.g_nll` for those messages, and the field's
    score is the span NLL of the value in the server's own tokens."""
    import openai

    from gnll.integrations.dspy import field_segment

    with ServerThread(build_inprocess_app(smollm, ServeSettings(), max_wait_ms=1)) as srv:
        model = dspy.LM(
            "openai/smollm2-135m-instruct",
            api_base=srv.url + "/v1",
            api_key="x",
            max_tokens=60,
            cache=False,
        )
        with dspy.context(lm=model, adapter=dspy.ChatAdapter()):
            qa = FieldConfidence("question -> answer", server="gnll")
            qa.predict.demos = [
                dspy.Example(question="What is the capital of Italy?", answer="Rome"),
                dspy.Example(question="What is the capital of Spain?", answer="Madrid"),
            ]
            pred = qa(question="What is the capital of France?")
        messages = model.history[-1]["messages"]
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        ref = client.chat.completions.create(
            model="smollm2-135m-instruct",
            messages=messages,
            max_tokens=60,
            logprobs=True,
        ).choices[0]
    u = ref.uncertainty
    assert abs(pred.uncertainty["completion_nll"] - u["g_nll"]) <= 1e-6  # same path: the server's record of the log-probs DSPy re-reads
    text = "".join(u["tokens"])
    span = span_nlls(u["tokens"], u["token_logprobs"], text, [field_segment(text, "answer")])
    assert abs(pred.g_nll - span.spans[0].nll) <= 1e-6  # same path: float64 sums of the same log-probs
    assert pred.g_nll < u["g_nll"]  # the markers' tokens are not in it
    assert pred.answer and pred.answer in ref.message.content


def test_recorded_vllm_answer_with_markers_and_eos():
    """A vLLM-shaped answer in the ChatAdapter's format, ending at EOS (whose log-prob vLLM
    reports): the whole completion's NLL is `gnll serve --upstream`'s g_nll (EOS not in it), the
    field's is its value's tokens only."""
    tokens, lps = CHAT
    answer = vllm_chat_answer(tokens, lps, eos=-0.4)
    with vllm_and_proxy(answer) as (vllm, proxy, _):
        ref = proxy_record(proxy, "q")
        model = dspy.LM(
            "hosted_vllm/served-model", api_base=vllm.url + "/v1", api_key="x", cache=False
        )
        with dspy.context(lm=model, adapter=dspy.ChatAdapter()):
            pred = FieldConfidence("question -> answer", server="vllm")(question="q")
    assert pred.answer == "Paris"
    assert abs(pred.uncertainty["completion_nll"] - ref["g_nll"]) <= 1e-6  # same path: the proxy's record of the log-probs DSPy re-reads
    assert ref["num_tokens"] == len(tokens)  # the EOS token is not the answer's
    assert abs(pred.g_nll - -(lps[6] + lps[7])) <= 1e-9  # same path: float64 sums of the log-probs the server sent
