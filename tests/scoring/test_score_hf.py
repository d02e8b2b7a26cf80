"""`gnll.score` on the hf backend: the model's own greedy answers reproduce their G-NLL, and
`gnll score` end to end on the embedded model."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gnll.cli.main import app
from gnll.evaluation.data.prompts import ask_prompt

pytestmark = pytest.mark.model

QUESTIONS = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Who wrote Romeo and Juliet?",
    "What is the chemical symbol for gold?",
    "Which planet is known as the Red Planet?",
]


@pytest.mark.parametrize("fixture", ["smollm", "gemma"])
def test_scoring_own_greedy_answers_reproduces_g_nll(fixture, request):
    """The backend's own greedy answers, scored as text: same G-NLL within 1e-4, all is_greedy; a
    perturbed answer is not greedy and is less likely."""
    from gnll import GenerationConfig, score

    model = request.getfixturevalue(fixture)
    prompts = [ask_prompt(q, long=False) for q in QUESTIONS]
    gens = [g for [g] in model.generate(prompts, GenerationConfig.greedy(max_new_tokens=30))]
    # A base model sometimes stops at once; an empty answer is not an answer to score.
    prompts, gens = zip(
        *[(p, g) for p, g in zip(prompts, gens, strict=True) if g.text], strict=True
    )
    assert len(gens) >= 3
    scored = score(model, prompts, [g.text for g in gens])
    for g, s in zip(gens, scored, strict=True):
        assert not s.boundary_merged, g.text
        assert s.nll == pytest.approx(-g.logprob, abs=1e-4), (g.text, s.tokens, g.tokens)
        assert s.num_tokens == g.num_tokens
        assert s.is_greedy is True, g.text
        if g.finish_reason in ("stop", "eos"):
            assert s.greedy_stops is True, g.text
    perturbed = ["Zanzibar " + g.text for g in gens]
    worse = score(model, prompts, perturbed)
    for s, w in zip(scored, worse, strict=True):
        assert w.is_greedy is False
        assert w.nll > s.nll


def test_gnll_score_cli_end_to_end(tmp_path, smollm):
    rows = [
        {"id": "a", "question": "What is the capital of France?", "answer": "Paris"},
        {"id": "b", "question": "What is the capital of France?", "answer": "Berlin"},
        {"id": "c", "question": "What is the capital of France?"},
    ]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["score", "-i", str(inp), "-o", str(out), "--no-progress", "--calibration", "auto"]
    res = CliRunner().invoke(app, [*args, "--with-greedy"])
    assert res.exit_code == 1, res.output  # row c has no answer
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in got] == ["a", "b"]
    assert got[0]["nll"] < got[1]["nll"]
    assert 0 < got[1]["p_correct"] <= got[0]["p_correct"] < 1
    assert isinstance(got[0]["abstain"], bool)
    # The greedy answer's G-NLL, rescored as a given answer, is its own NLL.
    from gnll import score

    [s] = score(
        smollm,
        [ask_prompt("What is the capital of France?", long=False)],
        [got[0]["greedy_answer"]],
    )
    assert s.nll == pytest.approx(got[0]["g_nll"], abs=1e-4) and s.is_greedy
