"""``gnll generate --policy refuse --early`` with a reasoning model (``--model_args
reasoning=think``): the trace runs to its end, the answer stops at its exact early decision, and
the decisions equal those made at the end of the answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import gnll
from gnll.backends.reasoning_model import ReasoningModel
from gnll.cli.main import app
from gnll.serving import AbstentionPolicy
from tests.serve_helpers import LONG, STREAM_SCRIPT, SURE, THOUGHTS, Thinker

runner = CliRunner()


@pytest.fixture
def thinker(monkeypatch):
    m = Thinker()

    def load(name, *, reasoning=None, **kw):
        assert reasoning == "think"
        return ReasoningModel(m, reasoning)

    monkeypatch.setattr(gnll, "load_model", load)
    return m


def run(tmp_path: Path, *extra: str, name: str) -> list[dict]:
    inp = tmp_path / "q.jsonl"
    inp.write_text("".join(json.dumps({"question": q}) + "\n" for q in ("sure", "unsure", "long")))
    out = tmp_path / name
    args = ["generate", "-i", str(inp), "-o", str(out), "--no-progress", "--prompt_format", "text"]
    args += ["--model_args", "reasoning=think", "--max_new_tokens", "100"]
    res = runner.invoke(app, [*args, "--policy", "refuse", "--threshold", "1.2", *extra])
    assert res.exit_code == 0, res.output
    return [json.loads(x) for x in out.read_text().splitlines()]


def test_early_decisions_on_a_reasoning_model_equal_the_end_of_answer_ones(tmp_path, thinker):
    early = run(tmp_path, "--early", name="early.jsonl")
    made_early, thinker.generated = thinker.generated, 0
    full = run(tmp_path, "--no_early", name="full.jsonl")
    policy = AbstentionPolicy(mode="refuse", threshold=1.2)
    whole = [SURE[1], STREAM_SCRIPT["unsure"][1], LONG[1][:100]]
    expected = [policy.decide(-sum(lps))[1] for lps in whole]
    assert [r["refused"] for r in early] == [r["refused"] for r in full] == expected
    assert expected == [False, True, True]
    sure, unsure, long = early
    assert sure["answer"] == "Paris." and "decided_at_token" not in sure
    # Counted from the answer's first token, after the trace (NLL 30) and the marker.
    assert (unsure["decided_at_token"], unsure["tokens_generated"]) == (1, 1)
    assert (long["decided_at_token"], long["tokens_generated"], long["tokens_saved"]) == (3, 3, 97)
    assert long["g_nll"] == pytest.approx(1.5) and long["g_nll_is_lower_bound"] is True
    assert all(r["trace_tokens"] == len(THOUGHTS[0]) for r in early + full)
    assert all("decided_at_token" not in r for r in full)
    # Every trace ran to its end (30 tokens and an EOS) both ways; the answers: "Paris." and EOS,
    # then 1 and 3 tokens early against 2 (+ EOS) and 100 at the end.
    trace = len(THOUGHTS[0]) + 1
    assert made_early == 3 * trace + 3 + 1 + 3
    assert thinker.generated == 3 * trace + 3 + 3 + 100


@pytest.mark.model
def test_smollm_as_a_reasoning_model_same_refusals_with_and_without_early(
    tmp_path, smollm, monkeypatch
):
    """``gnll generate`` on SmolLM2 wrapped as a reasoning model (a 16-token trace budget): the
    same refusals both ways, after the same traces; one refusal is decided before its answer's
    end (this set of questions has one whose answer passes 1.5 part-way)."""
    monkeypatch.setattr(
        gnll, "load_model", lambda name, **kw: ReasoningModel(smollm, "think", trace_budget=16)
    )
    qs = [
        "What is the capital of France?",
        "Who wrote Moby-Dick?",
        "Describe how a steam engine works.",
        "In which year did the Berlin Wall fall?",
        "Explain photosynthesis.",
        "What is the chemical symbol for gold?",
    ]
    inp = tmp_path / "q.jsonl"
    inp.write_text("".join(json.dumps({"question": q}) + "\n" for q in qs))

    def go(flag: str) -> list[dict]:
        out = tmp_path / f"out{flag}.jsonl"
        args = ["generate", "-i", str(inp), "-o", str(out), "--no-progress"]
        args += ["--model_args", "reasoning=think", "--max_new_tokens", "40"]
        res = runner.invoke(app, [*args, "--policy", "refuse", "--threshold", "1.5", flag])
        assert res.exit_code == 0, res.output
        return [json.loads(x) for x in out.read_text().splitlines()]

    early, full = go("--early"), go("--no_early")
    assert [r["refused"] for r in early] == [r["refused"] for r in full]
    assert [r["trace_tokens"] for r in early] == [r["trace_tokens"] for r in full]
    stopped = [(e, f) for e, f in zip(early, full, strict=True) if e.get("early")]
    assert stopped
    for e, f in stopped:
        assert f["refused"] and 1.5 < e["g_nll"] <= f["g_nll"] + 1e-6
        assert e["decided_at_token"] <= f["num_tokens"]
        assert e["tokens_saved"] == 40 - e["tokens_generated"] > 0
    for e, f in zip(early, full, strict=True):
        if not e.get("early"):
            assert e["g_nll"] == pytest.approx(f["g_nll"], abs=1e-4)
