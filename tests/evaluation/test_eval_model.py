"""End-to-end `gnll eval` on the real default model (slow on CPU: run with `pytest -m model`)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def model(smollm):
    """The session's SmolLM2 (conftest), not a second load of it."""
    return smollm


def test_end_to_end_real_model(model, tmp_path):
    from gnll.evaluation.run.runner import EvalConfig, Evaluator

    cfg = EvalConfig(
        model="smollm2-135m-instruct",
        tasks=["svamp_short", "triviaqa_long"],
        output_path=tmp_path / "run",
        limit=4,
        beams=2,
        samples=2,
        temperatures=(0.5, 1.0),
        heldout_size=3,
        chunk_size=4,
        clusterer="exact",
        n_boot=100,
        plots=True,
        progress=False,
    )
    res = Evaluator(cfg, model=model).run()
    out = tmp_path / "run"
    recs = [json.loads(line) for line in (out / "samples.jsonl").open()]
    assert len(recs) == 8
    r = recs[0]
    assert r["prompt"].startswith("<|im_start|>")  # chat template of the instruction-tuned model
    assert "Context: " in r["prompt"] and r["prompt"].rstrip().endswith("assistant")
    assert len(r["samples"]) == 2 and len(r["beams"]) == 2
    g = r["greedy"]
    assert len(g["token_logprobs"]) == len(g["token_ids"]) and all(
        lp <= 0 for lp in g["token_logprobs"]
    )
    assert r["measures"]["g-nll"] == pytest.approx(-sum(g["token_logprobs"]))
    # beam search finds a sequence at least as likely as the greedy one (up to numerics)
    assert r["measures"]["bs-msp"] <= r["measures"]["g-nll"] + 1e-3
    t = res["tasks"]["svamp_short"]
    assert t["temperature"]["selected_by"] == "heldout"
    assert t["metrics"]["f1"]["n"] == 4
    assert res["tasks"]["triviaqa_long"]["correctness"] == ["contains"]
    assert (out / "table.md").read_text().count("smollm2-135m-instruct") >= 2
    assert (out / "plots" / "cost_auroc.png").exists()
    # resuming a finished run recomputes nothing and reproduces results.json
    before = (out / "results.json").read_bytes()
    calls = []
    real_generate = model.generate
    model.generate = lambda *a, **k: calls.append(1) or real_generate(*a, **k)
    try:
        Evaluator(EvalConfig(**{**cfg.__dict__, "resume": True}), model=model).run()
    finally:
        del model.generate
    assert not calls
    assert (out / "results.json").read_bytes() == before


def test_real_model_as_judge(model, tmp_path):
    """The judge path with a real model: replies are parsed or recorded as unparseable, never
    silently counted as wrong, and agreement with F1 is reported."""
    from gnll.evaluation.run.runner import EvalConfig, Evaluator

    cfg = EvalConfig(
        model="smollm2-135m-instruct",
        tasks=["triviaqa_short"],
        output_path=tmp_path / "judge",
        limit=3,
        measures=["g-nll"],
        correctness=["f1", "judge"],
        judge="smollm2-135m-instruct",
        n_boot=50,
        plots=False,
        progress=False,
    )
    res = Evaluator(cfg, model=model, judge=model).run()
    t = res["tasks"]["triviaqa_short"]
    assert t["correctness"] == ["f1", "judge"]
    jm = t["metrics"]["judge"]
    assert jm["n"] + jm["n_undecided"] == 3
    recs = [json.loads(line) for line in (tmp_path / "judge" / "samples.jsonl").open()]
    for r in recs:
        verdict = r["correctness"]["judge"]
        assert verdict["judge"] == "smollm2-135m-instruct" and isinstance(verdict["reply"], str)
        assert verdict["detail"] in ("yes", "no", "unparseable")
        # an unparseable reply is undecided, not "incorrect"
        assert (verdict["correct"] is None) == (verdict["detail"] == "unparseable")
    assert "f1_vs_judge" in t["agreement"]
