"""`gnll eval` with a reasoning model (``--model_args reasoning=think``): every measure scores the
answer after the end-of-reasoning marker, and table.md says so."""

from __future__ import annotations

import json

import pytest
from fakes import FakeModel, cfg, make_data_dir

from gnll.backends.reasoning_model import ReasoningModel
from gnll.evaluation.run.runner import Evaluator


class Thinker(FakeModel):
    """The runner's fake model; its traces are the fake answer to the question (NLL > 0)."""

    def generate(self, prompts, config=None, *, raw_prompt=False, **kw):
        return super().generate(prompts, config, **kw)


@pytest.fixture
def data_dir(tmp_path):
    return make_data_dir(tmp_path / "data")


def test_eval_scores_the_answer_and_the_table_says_so(data_dir, tmp_path):
    inner = Thinker()
    model = ReasoningModel(inner, "think", trace_budget=8)
    out = tmp_path / "run"
    Evaluator(cfg(data_dir, out, measures=["g-nll"]), model=model).run()
    table = (out / "table.md").read_text()
    assert "Reasoning model" in table and "end-of-reasoning marker" in table
    rec = json.loads((out / "samples.jsonl").open().readline())
    greedy = rec["greedy"]
    split = greedy["reasoning"]
    assert split["format"] == "think" and split["trace_logprobs"]
    # G-NLL is the answer's: its tokens' log-probs only, the trace's are beside it
    assert rec["measures"]["g-nll"] == pytest.approx(-sum(greedy["token_logprobs"]))
    # half the greedy calls decoded traces, half answers after prompt + trace + marker
    assert inner.calls["greedy"] == 2 * 48
    components = json.loads((out / "results.json").read_text())["components"]
    assert components["model"]["reasoning"]["format"] == "think"
    # a calibration fitted on this run records that its G-NLL is the answer's
    from gnll.calibration import calibrate_files

    cal, _ = calibrate_files([out], target_coverage=None, target_accuracy=None)
    assert cal.meta["scored"] == "answer"
