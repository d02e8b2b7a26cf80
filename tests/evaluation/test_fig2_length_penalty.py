"""Fig. 2's beam curve rerun with transformers' ``length_penalty=1.0``: the committed result files
(bench/results/fig2_lp/) are what docs/evaluation.md's table says, and the ``length_penalty=0``
rerun is the committed Fig. 2 curve itself (so the two files compare the two searches, nothing
else)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "fig2_lp"


def _script():
    spec = importlib.util.spec_from_file_location(
        "fig2_beam_length_penalty", ROOT / "scripts" / "fig2_beam_length_penalty.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _table_rows() -> dict[tuple[str, str], list[str]]:
    """The docs table: (model, penalty) -> the four widths' AUROCs as printed."""
    raw = (ROOT / "docs" / "evaluation.md").read_text(encoding="utf-8")
    section = raw.split("**The beam curve with transformers' length penalty.**", 1)[1]
    section = section.split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| (\w+), all 100 \((\d+)\) \| ([\d.]+)[^|]* \| (.*) \|$", line)
        if m:
            rows[(m.group(1), m.group(3))] = [c.strip() for c in m.group(4).split("|")]
    return rows


def _printed(auroc: float) -> str:
    return f"{auroc:.3f}".lstrip("0")


@pytest.mark.parametrize(
    "model,result", [("SmolLM2", "fig2_smollm2.json"), ("Gemma", "fig2_gemma.json")]
)
def test_the_docs_table_is_the_committed_rerun(model, result):
    prefix = model.lower()
    lp1 = str(RESULTS / f"{prefix}-lp1.0.jsonl")
    got = _script().curves(str(ROOT / "docs" / "img" / result), [lp1], se=False)
    assert len(got["ids"]) == 100
    table = _table_rows()
    widths = ("2", "3", "4", "5")
    curve = got["files"][lp1]["auroc"]
    assert table[(model, "1.0")] == [_printed(curve[w][0]) for w in widths]
    assert table[(model, "0")] == [_printed(got["committed"][w]) for w in widths]


def test_the_length_penalty_0_rerun_is_the_committed_curve():
    """SmolLM2's ``length_penalty=0`` rerun gives the committed curve (same rankings, same AUROCs),
    so a ``length_penalty=1.0`` file compares the two searches, nothing else; and the penalty only
    ever makes the top beam less likely (it changes the search, not the score)."""
    files = [str(RESULTS / f"smollm2-lp{lp}.jsonl") for lp in ("1.0", "0")]
    got = _script().curves(str(ROOT / "docs" / "img" / "fig2_smollm2.json"), files, se=False)
    lp0 = got["files"][files[1]]["auroc"]
    for w in ("2", "3", "4", "5"):
        assert lp0[w][0] == pytest.approx(got["committed"][w], abs=1e-12)  # same path: same ranks
    first, second = (got["files"][p]["rows"] for p in files)
    for w in ("2", "3", "4", "5"):
        assert all(first[i]["nll"][w] >= second[i]["nll"][w] - 1e-4 for i in got["ids"])
