"""The typed ``uncertainty`` record (gnll.uncertainty): its JSON, and one naming of the span fields on
every surface (``gnll.ask``, ``gnll score``, ``gnll serve``)."""

from __future__ import annotations

import json

import httpx
import pytest

from gnll.backends.base import Capabilities, Generation, Model, ScoredAnswer
from gnll.spans import span_nlls
from gnll.uncertainty import SPAN_FIELDS, LocalAnswer, Uncertainty, span_columns, span_fields

# One answer of two sentences, the second less certain; tokens spell the text exactly.
TOKENS = ["Paris", " is", " big", ".", " Or", " Lyon", "?"]
LOGPROBS = [-0.1, -0.2, -0.3, -0.05, -2.0, -3.0, -0.5]
TEXT = "".join(TOKENS)


class OneAnswer(Model):
    """Gives (and scores) the same answer, with the same tokens and log-probs, whatever it is asked."""

    name = "one-answer"
    capabilities = Capabilities(beams=False, scoring=True)

    def render_prompt(self, prompt: str) -> str:
        return prompt

    def generate(self, prompts, config=None, **kwargs):
        n = config.num_sequences if config is not None else 1
        gen = Generation(TEXT, list(range(len(TOKENS))), list(TOKENS), list(LOGPROBS), "eos")
        return [[gen] * n for _ in prompts]

    def score(self, prompts, answers, **kwargs):
        return [
            ScoredAnswer(a, list(range(len(TOKENS))), list(TOKENS), list(LOGPROBS), True, True)
            for a in answers
        ]


def test_ask_score_and_serve_give_equal_span_fields_for_one_answer(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import gnll
    from gnll.cli.main import app
    from gnll.serving import ServeSettings, build_inprocess_app
    from gnll.serving.server import ServerThread

    model = OneAnswer()
    asked = gnll.ask(model, "Where?", spans="sentence").spans

    monkeypatch.setattr(gnll, "load_model", lambda name, **kw: model)
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps({"question": "Where?", "answer": TEXT}) + "\n", encoding="utf-8")
    res = CliRunner().invoke(
        app, ["score", "-i", str(inp), "-o", str(out), "--no-progress", "--spans", "sentence"]
    )
    assert res.exit_code == 0, res.output
    [scored] = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    res = CliRunner().invoke(app, ["ask", "Where?", "--json", "--spans", "sentence"])
    assert res.exit_code == 0, res.output
    asked_cli = json.loads(res.stdout)

    with ServerThread(build_inprocess_app(model, ServeSettings(), max_wait_ms=5)) as srv:
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Where?"}, timeout=30)
    served = r.json()["choices"][0]["uncertainty"]

    def fields(rec):
        return {k: rec[k] for k in SPAN_FIELDS}

    assert fields(served) == fields(scored) == fields(asked) == fields(asked_cli)
    assert served["least_certain_span"] == "2"  # a path, on every surface
    assert [s["text"] for s in served["spans"]] == ["Paris is big.", "Or Lyon?"]
    assert set(served["spans"][0]) == {
        "path",
        "text",
        "start",
        "end",
        "nll",
        "num_tokens",
        "straddling",
    }
    assert asked_cli["max_span_nll"] == scored["max_span_nll"] == pytest.approx(5.5)


def test_the_record_leaves_out_what_says_nothing_and_keeps_the_always_present_fields():
    u = Uncertainty(decoding="greedy", g_nll=0.5, ln_g_nll=0.25, nll=0.5, num_tokens=2)
    assert list(u.to_json()) == [
        "measure",
        "decoding",
        "g_nll",
        "ln_g_nll",
        "nll",
        "num_tokens",
        "p_correct",
        "abstain",
        "spans",
        "spans_kind",
        "least_certain_span",
    ]
    # an escalation's record: who answered, and the local answer with its text and model
    local = LocalAnswer.model_validate(u.to_json() | {"text": "Lyon", "model": "small"})
    up = u.model_copy(update={"answered_by": "big", "escalated": True, "local": local})
    js = up.to_json()
    assert js["answered_by"] == "big" and js["escalated"] is True
    assert js["local"]["text"] == "Lyon" and "answered_by" not in js["local"]
    assert Uncertainty.model_validate(js) == up  # the JSON reads back as the same record


def test_a_record_refuses_unknown_fields_and_wrong_types():
    with pytest.raises(ValueError, match="least_certain"):
        Uncertainty(decoding="greedy", nll=1.0, num_tokens=1, least_certain=0)
    with pytest.raises(ValueError, match="decoding"):
        Uncertainty(decoding="beam", nll=1.0, num_tokens=1)


def test_span_fields_of_no_spans_and_of_an_answer_without_json():
    assert span_fields(None) == dict.fromkeys(SPAN_FIELDS)
    cols = span_columns(TOKENS, LOGPROBS, TEXT, "json")
    assert (
        cols["spans"] is None and cols["spans_kind"] == "json" and "no JSON" in cols["spans_error"]
    )
    report = span_nlls(TOKENS, LOGPROBS, TEXT, "sentence")
    assert span_fields(report)["least_certain_span"] == report.least_certain().path == "2"
