"""scripts/check_tolerances.py: the lint step refuses a float comparison tighter than the documented
tolerance across computation paths (BATCH_INVARIANCE_ATOL), unless its line says why both sides
come from the same path; and the test suite has none."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gnll.backends.base import BATCH_INVARIANCE_ATOL

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("check_tolerances", ROOT / "scripts/check_tolerances.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def found(source: str) -> list[str]:
    return [what for _, what in check.findings(source)]


@pytest.mark.parametrize(
    "line",
    [
        "assert a == pytest.approx(b, abs=1e-5)",
        "assert a == approx(b, rel=0, abs=1e-9)",
        "np.testing.assert_allclose(a, b, atol=1e-6)",
        "assert np.allclose(a, b, rtol=0, atol=5e-5)",
        "assert math.isclose(a, b, abs_tol=1e-12)",
        "assert abs(a - b) <= 1e-5",
        "assert abs(x.nll - y.nll) < 1e-6",
        "assert 1e-6 >= abs(a - b)",
    ],
)
def test_a_tolerance_below_the_documented_one_is_flagged(line):
    assert len(found(line)) == 1


@pytest.mark.parametrize(
    "line",
    [
        "assert a == pytest.approx(b, abs=BATCH_INVARIANCE_ATOL)",
        "assert a == pytest.approx(b, abs=1e-4)",
        "np.testing.assert_allclose(a, b, atol=1e-3)",
        "assert a == pytest.approx(b, rel=1e-9)",  # relative: another rule
        "assert a == pytest.approx(b, abs=0)",  # exact: a visible claim of the same path
        "assert a == b",
        "assert abs(a - b) > 1e-3",  # a difference that must show
        "assert abs(a) <= 1e-9",  # no difference of two values
        "assert abs(a - b) <= 1e-5  # same path: float64 sums of the same log-probs",
    ],
)
def test_documented_exact_or_marked_comparisons_pass(line):
    assert found(line) == []


def test_the_marker_may_sit_on_any_line_of_a_comparison():
    source = "assert a == pytest.approx(\n    b, abs=1e-9  # same path: one float64 sum\n)\n"
    assert found(source) == []
    assert found(source.replace("# same path: one float64 sum", "")) == ["approx(abs=1e-09)"]


def test_the_documented_tolerance_is_the_libraries():
    assert check.DOCUMENTED == BATCH_INVARIANCE_ATOL


def test_the_test_suite_and_benchmarks_have_no_such_comparison():
    bad = [
        f"{f.relative_to(ROOT)}:{line}: {what}"
        for tree in ("tests", "bench")
        for f in sorted((ROOT / tree).rglob("*.py"))
        for line, what in check.findings(f.read_text(), str(f))
    ]
    assert bad == []
