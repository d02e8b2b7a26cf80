"""docs/scoring.md's worked example (steps 3 and 4) is what the commands print today: the table of
scored answers and `gnll ask`'s decision, with the shipped calibration and its default rule, are
recomputed here and compared with the page (``scripts/scoring_example.sh`` regenerates them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gnll import score
from gnll.calibration import load_calibration
from gnll.serving import AbstentionPolicy

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "scoring.md").read_text(encoding="utf-8")
ROW = re.compile(r"^(q\d+)\s+.*?nll=\s*([\d.]+).*p_correct=([\d.]+) abstain=(True|False)$", re.M)


def test_the_worked_example_shows_what_the_shipped_calibration_decides(smollm):
    import json

    rows = [json.loads(line) for line in (ROOT / "docs/examples/answers.jsonl").open()]
    rows = [r for r in rows if "answer" in r]
    questions, answers = [r["question"] for r in rows], [r["answer"] for r in rows]
    scored = score(smollm, questions, answers, prompt_format="instruction")
    cal = load_calibration("auto", model=smollm.name)
    policy = AbstentionPolicy(mode="flag", calibrator=cal)
    shown = {m[0]: (float(m[1]), float(m[2]), m[3] == "True") for m in ROW.findall(PAGE)}
    assert len(shown) == len(rows)
    for r, s in zip(rows, scored, strict=True):
        p, abstain = policy.decide(s.nll)
        assert shown[r["id"]] == (
            pytest.approx(s.nll, abs=1e-3),
            pytest.approx(p, abs=1e-3),
            abstain,
        ), r["id"]
    q10 = shown["q10"]
    decision = "abstain" if q10[2] else "answer"
    assert f"P(correct): {q10[1]:.3f}  -> {decision}" in PAGE  # step 4, gnll ask
