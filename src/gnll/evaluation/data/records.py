"""Reading dataset files row by row, with the file and line of every row, and checking each field.

Every problem found in a dataset file is a :class:`DataError` whose message starts with
``file:line`` and names the field, so a user can open the file at the right place; rows from the
Hugging Face hub are located as ``hub <name> row <i>`` instead.

>>> import pathlib, tempfile
>>> p = pathlib.Path(tempfile.mkdtemp()) / "d.jsonl"
>>> _ = p.write_text('{"question": "Q?", "aliases": "Paris"}\\n')
>>> row = next(iter_jsonl(p))
>>> try:
...     str_list_field(row, "aliases")
... except DataError as exc:
...     print(str(exc).split(": ", 1)[1])
field 'aliases' must be a list of strings, got a string ('Paris'); write it as ["Paris"]
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DataError",
    "Row",
    "arith",
    "finite_number_field",
    "id_field",
    "iter_json_array",
    "iter_jsonl",
    "optional_str_field",
    "str_field",
    "str_list_field",
]


class DataError(ValueError):
    """A dataset file, or one of its rows, does not have the expected shape."""


@dataclass(frozen=True)
class Row:
    """One record of a dataset and where it came from (``where`` is ``file:line``)."""

    where: str
    data: Mapping[str, Any]


def _line_of(data: bytes | str, pos: int) -> int:
    newline = b"\n" if isinstance(data, bytes) else "\n"
    return data.count(newline, 0, pos) + 1  # type: ignore[arg-type]


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{where}: not valid UTF-8 (byte {exc.start + 1} of the line); re-save the file as UTF-8"
        ) from None


def _as_row(obj: Any, where: str) -> Row:
    if not isinstance(obj, dict):
        raise DataError(
            f"{where}: expected a JSON object with the dataset's fields, got {_kind(obj)}"
        )
    return Row(where, obj)


def iter_jsonl(path: Path) -> Iterator[Row]:
    """The objects of a JSON-lines file, one per non-blank line, each with its ``file:line``."""
    with Path(path).open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            where = f"{path}:{lineno}"
            text = _decode(raw, where)
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"{where}: not valid JSON ({exc.msg}, column {exc.colno})"
                ) from None
            yield _as_row(obj, where)


def iter_json_array(path: Path) -> Iterator[Row]:
    """The elements of a file holding one JSON list, each with the line its element starts on."""
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{path}:{_line_of(raw, exc.start)}: not valid UTF-8; re-save the file as UTF-8"
        ) from None
    decoder = json.JSONDecoder()
    ws = re.compile(r"\s*")
    pos = ws.match(text, 0).end()
    if not text.startswith("[", pos):
        raise DataError(f"{path}:{_line_of(text, pos)}: expected a JSON list of records")
    pos = ws.match(text, pos + 1).end()
    if text.startswith("]", pos):
        return
    while True:
        try:
            obj, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
        yield _as_row(obj, f"{path}:{_line_of(text, pos)}")
        pos = ws.match(text, end).end()
        if text.startswith(",", pos):
            pos = ws.match(text, pos + 1).end()
        elif text.startswith("]", pos):
            break
        else:
            raise DataError(f"{path}:{_line_of(text, pos)}: not valid JSON (expected ',' or ']')")
    rest = ws.match(text, pos + 1).end()
    if rest != len(text):
        raise DataError(f"{path}:{_line_of(text, rest)}: unexpected text after the JSON list")


# --------------------------------------------------------------------------- field checks
def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return f"a string ({_short(value)})"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _short(text: str, n: int = 40) -> str:
    return repr(text if len(text) <= n else text[: n - 3] + "...")


def _get(row: Row, key: str) -> Any:
    if key not in row.data:
        raise DataError(
            f"{row.where}: missing field {key!r} (has {sorted(row.data)}); "
            "is this the right file for the dataset?"
        )
    return row.data[key]


def str_field(row: Row, key: str, *, allow_empty: bool = False) -> str:
    """``row[key]`` as a stripped string; an error for anything else (or blank text)."""
    value = _get(row, key)
    if not isinstance(value, str):
        raise DataError(f"{row.where}: field {key!r} must be a string, got {_kind(value)}")
    value = value.strip()
    if not value and not allow_empty:
        raise DataError(f"{row.where}: field {key!r} is empty")
    return value


def optional_str_field(row: Row, key: str) -> str | None:
    """``row[key]`` if present and not null (must then be a string), else ``None``."""
    value = row.data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise DataError(f"{row.where}: field {key!r} must be a string, got {_kind(value)}")
    return value


def str_list_field(row: Row, key: str) -> tuple[str, ...]:
    """``row[key]`` as a non-empty tuple of non-blank strings (gold answers).

    A bare string is refused rather than split into characters, which would make every single
    letter a gold answer.
    """
    value = _get(row, key)
    if isinstance(value, str):
        raise DataError(
            f"{row.where}: field {key!r} must be a list of strings, got {_kind(value)}; "
            f"write it as [{json.dumps(value, ensure_ascii=False)}]"
        )
    if not isinstance(value, list):
        raise DataError(f"{row.where}: field {key!r} must be a list of strings, got {_kind(value)}")
    if not value:
        raise DataError(
            f"{row.where}: field {key!r} is an empty list; every question needs a gold answer"
        )
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise DataError(f"{row.where}: field {key}[{i}] must be a string, got {_kind(item)}")
        if not item.strip():
            raise DataError(f"{row.where}: field {key}[{i}] is an empty answer")
        out.append(item)
    return tuple(out)


def finite_number_field(row: Row, key: str) -> float:
    """``row[key]`` as a finite float (a JSON number or a numeric string; never NaN or inf)."""
    value = _get(row, key)
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None:
        raise DataError(f"{row.where}: field {key!r} must be a number, got {_kind(value)}")
    if not math.isfinite(number):
        raise DataError(f"{row.where}: field {key!r} must be a finite number, got {value!r}")
    return number


def id_field(row: Row, key: str, default: str | None = None) -> str:
    """An identifier: a string or an integer (``default``, if given, when the field is absent)."""
    if key not in row.data and default is not None:
        return default
    value = _get(row, key)
    if isinstance(value, bool) or not isinstance(value, str | int) or str(value).strip() == "":
        raise DataError(
            f"{row.where}: field {key!r} must be a string or integer id, got {_kind(value)}"
        )
    return str(value)


# --------------------------------------------------------------------------- arithmetic
_TOKEN = re.compile(r"\s*(?:(\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)|([-+*/()]))")
_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "neg": 3}


def arith(expr: str) -> float | None:
    """Value of an arithmetic expression (numbers, ``+ - * /``, parentheses, unary minus).

    Evaluated with an explicit operator stack, so a 3,000-term equation costs no recursion;
    ``None`` when the text is not such an expression or divides by zero.

    >>> arith("( 76.0 - 25.0 ) / 3"), arith("-2 * 3"), arith("1 +"), arith("4 / 0")
    (17.0, -6.0, None, None)
    """
    values: list[float] = []
    ops: list[str] = []

    def apply(op: str) -> None:
        if op == "neg":
            values.append(-values.pop())
            return
        b, a = values.pop(), values.pop()
        values.append(a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b)

    pos, expect_operand, text = 0, True, expr.rstrip()
    try:
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                return None
            pos = m.end()
            number, sym = m.group(1), m.group(2)
            if number is not None:
                if not expect_operand:
                    return None
                values.append(float(number))
                expect_operand = False
            elif expect_operand:
                if sym == "-":
                    ops.append("neg")
                elif sym == "(":
                    ops.append("(")
                else:
                    return None
            elif sym == ")":
                while ops and ops[-1] != "(":
                    apply(ops.pop())
                if not ops:
                    return None
                ops.pop()
            elif sym == "(":
                return None
            else:
                while ops and ops[-1] != "(" and _PREC[ops[-1]] >= _PREC[sym]:
                    apply(ops.pop())
                ops.append(sym)
                expect_operand = True
        if expect_operand:
            return None
        while ops:
            op = ops.pop()
            if op == "(":
                return None
            apply(op)
    except (IndexError, ZeroDivisionError):
        return None
    return values[0] if len(values) == 1 else None
