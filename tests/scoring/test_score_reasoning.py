"""`gnll score` for reasoning models: a row's ``trace`` (or ``reasoning``) is teacher-forced as
context; the answer alone is scored."""

from __future__ import annotations

import pytest
from fakes import ToyModel

from gnll.backends.base import BATCH_INVARIANCE_ATOL, GenerationConfig
from gnll.backends.reasoning_model import ReasoningModel
from gnll.scoring import score
from gnll.scoring.rows import Item, to_item
from gnll.scoring.stream import ScoreJob, score_chunk


class RecordingToy(ToyModel):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []

    def score(self, prompts, answers, **kw):
        self.seen.extend(zip(prompts, answers, strict=True))
        return super().score(prompts, answers, **kw)


def item(row):
    return to_item(1, row, long=False, render_messages=None, raw_prompt=False)


def test_trace_field_is_read_and_checked():
    it = item({"prompt": "2+2?", "trace": "two and two", "answer": "4"})
    assert isinstance(it, Item) and it.trace == "two and two"
    assert item({"prompt": "2+2?", "reasoning": "hm", "answer": "4"}).trace == "hm"
    assert item({"prompt": "2+2?", "trace": 3, "answer": "4"}) == (
        "field 'trace' must be a string, got int"
    )
    assert item({"prompt": "2+2?", "answer": "4"}).trace is None


def test_the_trace_is_context_before_the_answer():
    toy = RecordingToy()
    rm = ReasoningModel(toy, "think")
    job = ScoreJob("in.jsonl", "out.jsonl", "jsonl", "jsonl", None).for_model(rm)
    rows = [(1, {"prompt": "2+2?", "trace": "two and two", "answer": "4"}, None)]
    res = score_chunk(rm, job, rows)
    [(prompt, answer)] = toy.seen
    assert prompt == "<user>2+2?</user>\n<think>\ntwo and two\n</think>\n\n" and answer == "4"
    [out] = res.rows
    assert out["scored"] == "answer" and out["num_tokens"] == 1  # the trace is not scored


def test_a_trace_needs_a_reasoning_model():
    from gnll.scoring.api import ScoringError

    with pytest.raises(ScoringError, match="reasoning=think"):
        score(ToyModel(), ["2+2?"], ["4"], traces=["two and two"])


@pytest.mark.model
def test_score_of_the_answer_given_its_trace_is_its_g_nll(smollm):
    """The answer a reasoning model generated, scored with its trace as context, has its G-NLL."""
    rm = ReasoningModel(smollm, "think", trace_budget=12)
    [[g]] = rm.generate(["What is 2+2?"], GenerationConfig.greedy(max_new_tokens=8))
    answer = "".join(g.tokens)
    job = ScoreJob("in.jsonl", "out.jsonl", "jsonl", "jsonl", None).for_model(rm)
    rows = [
        (1, {"prompt": "What is 2+2?", "trace": g.reasoning.trace_text, "answer": answer}, None),
        (2, {"prompt": "What is 2+2?", "answer": answer}, None),  # its own greedy trace
    ]
    res = score_chunk(rm, job, rows)
    assert not res.errors
    for out in res.rows:
        assert abs(out["nll"] - (-g.logprob)) <= BATCH_INVARIANCE_ATOL
        assert out["scored"] == "answer"
    # without the trace as context, the same answer has another NLL
    [plain] = score(smollm, ["What is 2+2?"], [answer])
    assert abs(plain.nll - (-g.logprob)) > 1e-3


def test_ask_reports_the_answers_g_nll_and_the_trace_beside_it():
    from gnll.backends.base import Generation
    from gnll.scoring.asking import ask

    class Reasoner(ToyModel):
        def render_prompt(self, prompt):
            return prompt

        def generate(self, prompts, config=None, **kw):
            if config is not None and "</think>" in config.stop:
                g = Generation("Hm.", [1], ["Hm."], [-2.0], "stop", terminator_logprobs=[-0.1])
            else:
                g = Generation("4", [2], ["4"], [-0.25], "eos", terminator_logprobs=[-0.01])
            return [[g] for _ in prompts]

    r = ask(ReasoningModel(Reasoner()), "What is 2+2?").to_dict()
    assert r["g_nll"] == pytest.approx(0.25) and r["answer"] == "4"
    assert (r["scored"], r["trace"], r["trace_nll"], r["trace_tokens"]) == ("answer", "Hm.", 2.0, 1)
