"""``--resume`` continues an output only from the input it was written from.

An output row carries the input row it came from (its fields, and ``input_line``). Before a
resume appends anything, the rows already written are compared with the input's rows on the same
lines, on the fields that say which row it is (``id`` and the columns the job reads: the
question, prompt or messages, and for ``gnll score`` the answer): the output itself is the
input's fingerprint. Another input (another file, reordered, edited) is refused in one line
before anything is written; the same input resumes as before.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from gnll._util import jsonable
from gnll.scoring.output import OutputExistsError
from gnll.scoring.rows import iter_rows

__all__ = ["check_same_input"]


def _output_rows(path: Path, fmt: str) -> Iterator[dict[str, Any]]:
    """The complete rows of an output (a torn last line, what a kill leaves, is skipped)."""
    if fmt == "csv":
        with path.open(newline="", encoding="utf-8", errors="surrogateescape") as fh:
            yield from csv.DictReader(fh)
        return
    with path.open("rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                return
            try:
                row = json.loads(raw)
            except ValueError:
                continue  # resume_point says what is wrong with such a line
            if isinstance(row, dict):
                yield row


def _same(value: Any, written: Any, fmt: str) -> bool:
    """Whether an input field's value is the one written in the output (CSV cells are text)."""
    if fmt == "csv":
        if isinstance(value, list | dict):
            return json.dumps(value, ensure_ascii=False) == written
        return ("" if value is None else str(value)) == written
    return bool(jsonable(value, nan="none") == written)


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return repr(text if len(text) <= 40 else text[:37] + "...")


def check_same_input(
    output: Path,
    fmt: str,
    input: str,
    input_format: str,
    fields: Iterable[str],
) -> None:
    """Raise :class:`~gnll.scoring.output.OutputExistsError` when ``output`` was not written from
    ``input``: a row of it whose ``fields`` differ from the input row on its ``input_line``, or
    that names a line the input does not have. Reads nothing from stdin (``input`` ``-``)."""
    if input == "-" or not output.exists():
        return
    keys = tuple(dict.fromkeys(["id", *fields]))
    done: dict[int, dict[str, Any]] = {}
    for row in _output_rows(output, fmt):
        try:
            done[int(row["input_line"])] = row
        except (KeyError, TypeError, ValueError):
            continue  # not an output row: resume_point refuses the file with its own message
    if not done:
        return
    last = max(done)
    seen = 0
    for line, row, _ in iter_rows(input, input_format):
        if line > last:
            break
        seen = line
        written = done.get(line)
        if written is None or row is None:
            continue
        for key in keys:
            if key in row and key in written and not _same(row[key], written[key], fmt):
                raise OutputExistsError(
                    f"{output} was written from another input: its row for input line {line} has "
                    f"{key} {_shown(written[key])}, line {line} of {input} has "
                    f"{_shown(row[key])}; nothing was changed. Resume with the input it was "
                    "written from, pass --overwrite to replace it, or choose another --output"
                )
    if seen < last:
        raise OutputExistsError(
            f"{output} was written from another input: it holds a row for input line {last}, "
            f"but {input} has {seen} lines; nothing was changed. Resume with the input it was "
            "written from, pass --overwrite to replace it, or choose another --output"
        )
