"""Refuse a float comparison in the tests tighter than the documented tolerance of its path.

Two different computation paths (a row scored alone vs in a batch, a proxy's split vs teacher
forcing, a server vs a framework re-reading its log-probs) agree on log-probs and NLLs within
``gnll.backends.base.BATCH_INVARIANCE_ATOL`` (1e-4), never closer: fp32 sums in another order differ
in the fifth decimal on another machine. So an absolute tolerance written as a number below 1e-4 is
flagged unless its line says why both sides come from the same path, with a comment

    # same path: <why the two values are computed the same way>

on the line of the comparison (any line of a comparison written over several lines). What is
flagged (``<lit>`` a number literal with 0 < lit < 1e-4):

- ``pytest.approx(..., abs=<lit>)``;
- ``atol=<lit>`` or ``abs_tol=<lit>`` in any call (``np.allclose``, ``np.isclose``,
  ``np.testing.assert_allclose``, ``math.isclose``, ...);
- ``abs(a - b) <= <lit>`` or ``< <lit>`` (either side).

A name (``BATCH_INVARIANCE_ATOL``) or a value of 1e-4 and above is not flagged, nor are relative
tolerances and exact comparisons (``==``, ``abs=0``): an exact check is a claim that the path is the
same, which a reader sees. Usage: ``python scripts/check_tolerances.py [PATH ...]`` (default:
``tests``); one line per finding, exit status 1 when there is one.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

#: gnll.backends.base.BATCH_INVARIANCE_ATOL, the tightest documented tolerance across paths.
DOCUMENTED = 1e-4
MARKER = "# same path:"
KEYWORDS = ("atol", "abs_tol")


def _literal(node: ast.AST) -> float | None:
    """The value of a number literal (``1e-5``, ``-1e-5`` is not a tolerance), else ``None``."""
    value = node.value if isinstance(node, ast.Constant) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _too_tight(node: ast.AST) -> bool:
    value = _literal(node)
    return value is not None and 0 < value < DOCUMENTED


def _is_abs_diff(node: ast.AST) -> bool:
    """``abs(a - b)``."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "abs"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.BinOp)
        and isinstance(node.args[0].op, ast.Sub)
    )


def findings(source: str, filename: str = "<source>") -> Iterator[tuple[int, str]]:
    """``(line, what)`` of each comparison tighter than the documented tolerance without a marker."""
    tree = ast.parse(source, filename)
    lines = source.splitlines()

    def marked(node: ast.AST) -> bool:
        start, end = node.lineno, getattr(node, "end_lineno", None) or node.lineno
        return any(MARKER in lines[i - 1] for i in range(start, end + 1))

    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            for kw in node.keywords:
                if kw.arg in KEYWORDS and _too_tight(kw.value):
                    what = f"{kw.arg}={ast.unparse(kw.value)}"
                elif name == "approx" and kw.arg == "abs" and _too_tight(kw.value):
                    what = f"approx(abs={ast.unparse(kw.value)})"
        elif isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, op, right = node.left, node.ops[0], node.comparators[0]
            if isinstance(op, (ast.Lt, ast.LtE)) and _is_abs_diff(left) and _too_tight(right):
                what = f"abs(a - b) {'<' if isinstance(op, ast.Lt) else '<='} {ast.unparse(right)}"
            if isinstance(op, (ast.Gt, ast.GtE)) and _is_abs_diff(right) and _too_tight(left):
                what = f"{ast.unparse(left)} > abs(a - b)"
        if what is not None and not marked(node):
            yield node.lineno, what


def main(argv: list[str]) -> int:
    paths = [Path(p) for p in argv] or [Path("tests")]
    files = [f for p in paths for f in (sorted(p.rglob("*.py")) if p.is_dir() else [p])]
    bad = 0
    for f in files:
        for line, what in findings(f.read_text(), str(f)):
            bad += 1
            print(
                f"{f}:{line}: {what} is tighter than the documented tolerance across paths "
                f"(BATCH_INVARIANCE_ATOL = {DOCUMENTED:g}); use it, or say '{MARKER} <why>'"
            )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
