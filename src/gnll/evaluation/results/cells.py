"""Cells, headers and columns of gnll's Markdown tables (shared by the table sections)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gnll import measures as M
from gnll.evaluation.results.groups import MIN_PER_CLASS

__all__ = ["SMALL_ROWS", "columns_of", "fmt", "header", "row_cells", "undefined"]

#: The table note on rows too small for a standard error or a star.
SMALL_ROWS = (
    f"± and `*` are printed only for rows with at least {MIN_PER_CLASS} correct and "
    f"{MIN_PER_CLASS} incorrect answers (an averaged row: in every task it averages); with fewer, "
    "the bootstrap standard error collapses and the test is not meaningful."
)


def undefined(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt(x: float | None) -> str:
    if undefined(x):
        return "–"
    s = f"{x:.3f}"
    return s[1:] if s.startswith("0.") else ("-" + s[2:] if s.startswith("-0.") else s)


def columns_of(results_list: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """The measure columns: :data:`gnll.measures.ORDER`, then each variant some run computed."""
    have = {
        m
        for res in results_list
        for tres in res["tasks"].values()
        for mres in (tres.get("metrics") or {}).values()
        for m in mres.get("measures") or {}
    }
    return M.ORDER + tuple(m for m in M.VARIANTS if m in have)


def row_cells(
    values: dict[str, float | None],
    ses: dict[str, float | None] | None,
    star: bool,
    columns: Sequence[str] = M.ORDER,
) -> list[str]:
    present = {m: v for m, v in values.items() if v is not None}
    best = max((round(v, 3) for v in present.values()), default=None)
    cells = []
    for m in columns:
        v = values.get(m)
        if v is None:
            cells.append("–")
            continue
        txt = fmt(v)
        if ses is not None and ses.get(m) is not None:
            txt += f" ± {fmt(ses[m])}"
        if best is not None and round(v, 3) == best:
            txt = f"**{txt}**"
        if star and m == "g-nll":
            txt += "\\*"
        cells.append(txt)
    return cells


def header(first: Sequence[str], columns: Sequence[str] = M.ORDER) -> list[str]:
    head = list(first) + [M.get(m).label for m in columns]
    return ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
