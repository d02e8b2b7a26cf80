"""Output of ``gnll score``: JSONL or CSV rows appended and flushed per batch, resumable.

Every output row carries ``input_line`` (its line in the input). ``--resume`` finds the last complete
row of an existing output (a torn last line from a kill is cut off), drops error records past it
(those rows are scored again) and continues with the input rows after it, so no row is written
twice and none is lost.

An output file is only ever appended to (``--resume``) or replaced whole when ``--overwrite`` was
asked (:func:`check_output`): an earlier run's output and errors file are never truncated, clobbered
or deleted silently, and a job never writes over its own input.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from gnll._util import jsonable

__all__ = [
    "ErrorLog",
    "OutputExistsError",
    "RowWriter",
    "check_output",
    "resume_point",
    "same_file",
]

#: Rows are flushed every batch (a killed process loses nothing written); fsync, which only matters
#: if the machine itself goes down, runs at most this often so small batches stay cheap.
FSYNC_SECONDS = 2.0


class _Syncer:
    def __init__(self) -> None:
        self._last = time.monotonic()

    def __call__(self, fh: TextIO, force: bool = False) -> None:
        fh.flush()
        now = time.monotonic()
        if force or now - self._last >= FSYNC_SECONDS:
            os.fsync(fh.fileno())
            self._last = now


class OutputExistsError(ValueError):
    """The output (or its errors file) holds an earlier run, or is the job's own input."""


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file (through symlinks and hard links); ``-`` is never a file."""
    if str(a) == "-" or str(b) == "-":
        return False
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return Path(a).resolve() == Path(b).resolve()


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _rows_in(path: Path, fmt: str) -> int:
    """Complete rows in an output or errors file (a CSV's header is not a row)."""
    with path.open("rb") as fh:
        lines = sum(1 for raw in fh if raw.strip())
    return max(0, lines - 1) if fmt == "csv" else lines


def check_output(
    input: str,
    output: str,
    errors: Path | None,
    output_format: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
) -> None:
    """Refuse, before anything is written, a job that would destroy data.

    Raises :class:`OutputExistsError` when ``output`` or ``errors`` is the input file itself (also
    through a symlink or a hard link: opening the output would truncate the input before it is read),
    when output and errors are one file, and when ``output`` or ``errors`` holds an earlier run and
    neither ``resume`` (continue it) nor ``overwrite`` (replace it) was asked.

    >>> check_output("-", "-", None, "jsonl")  # stdin to stdout: nothing to protect
    """
    if resume and overwrite:
        raise OutputExistsError("pass --resume or --overwrite, not both")
    if output == "-":
        if errors is not None and same_file(input, errors):
            raise OutputExistsError(f"the errors file {errors} is the input file")
        return
    if same_file(input, output):
        raise OutputExistsError(
            f"{output} is the input file {input}: writing it would erase the input before it is "
            "read; choose another --output"
        )
    if errors is not None and same_file(input, errors):
        raise OutputExistsError(f"the errors file {errors} is the input file {input}")
    if errors is not None and same_file(output, errors):
        raise OutputExistsError(f"the errors file {errors} is the output file")
    if errors is not None and errors.exists() and not _is_errors_file(errors):
        # Never a stale run to replace: a file of the user's (--overwrite would delete it).
        raise OutputExistsError(
            f"{errors} exists and is not a gnll errors file (its lines are not "
            '{"line": ..., "error": ...} records); nothing was changed. Choose another --errors'
        )
    if resume or overwrite:
        return
    out = Path(output)
    held = []
    has_rows = out.exists() and out.stat().st_size > 0
    if has_rows:
        held.append(_count(_rows_in(out, output_format), "row"))
    if errors is not None and errors.exists():
        failed = _count(_rows_in(errors, "jsonl"), "failed row")
        held.append(f"{failed} in {errors}")
        if not has_rows:  # a run whose every row failed, or a stale errors file
            raise OutputExistsError(
                f"the errors file {errors} holds {failed} of an earlier run, but {output} "
                f"{'is empty' if out.exists() else 'does not exist'}; nothing was changed. Pass "
                "--overwrite to replace it, or choose another --output or --errors"
            )
    if held:
        raise OutputExistsError(
            f"{output} holds an earlier run ({'; '.join(held)}); nothing was changed. Pass "
            "--resume to continue it, --overwrite to replace it, or choose another --output"
        )


def _is_errors_file(path: Path) -> bool:
    """Whether ``path`` holds :class:`ErrorLog` records (an empty file does too)."""
    with path.open("rb") as fh:
        for raw in fh:
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except ValueError:
                return False
            return isinstance(record, dict) and "line" in record and "error" in record
    return True


def _cut_torn_tail(path: Path) -> None:
    """Truncate a file after its last newline (what a kill mid-write leaves behind)."""
    size = path.stat().st_size
    if size == 0:
        return
    with path.open("rb+") as fh:
        pos = size
        while pos > 0:
            step = min(1 << 16, pos)
            fh.seek(pos - step)
            block = fh.read(step)
            nl = block.rfind(b"\n")
            if nl >= 0:
                end = pos - step + nl + 1
                if end < size:
                    fh.truncate(end)
                return
            pos -= step
        fh.truncate(0)


def _last_line_jsonl(path: Path) -> int:
    last = 0
    with path.open("rb") as fh:
        for raw in fh:
            try:
                last = max(last, int(json.loads(raw)["input_line"]))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(
                    f"{path}: cannot resume, a line is not a `gnll score` output row ({e})"
                ) from None
    return last


def _last_line_csv(path: Path) -> int:
    last = 0
    with path.open(newline="", encoding="utf-8", errors="surrogateescape") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None:
            return 0
        if "input_line" not in reader.fieldnames:
            raise ValueError(
                f"{path}: cannot resume, no input_line column (not a `gnll score` output)"
            )
        for row in reader:
            last = max(last, int(row["input_line"]))
    return last


def resume_point(output: Path, fmt: str, errors: Path | None) -> int:
    """The input line after which scoring continues; trims ``output`` and ``errors`` to match."""
    if not output.exists():
        return 0
    _cut_torn_tail(output)
    last = _last_line_csv(output) if fmt == "csv" else _last_line_jsonl(output)
    if errors is not None and errors.exists():
        _cut_torn_tail(errors)
        keep = []
        with errors.open("rb") as fh:
            for raw in fh:
                try:
                    if int(json.loads(raw)["line"]) <= last:
                        keep.append(raw)
                except (ValueError, KeyError, TypeError):
                    continue
        tmp = errors.with_name(f".{errors.name}.tmp")
        tmp.write_bytes(b"".join(keep))
        tmp.replace(errors)
    return last


class RowWriter:
    """Append rows as JSONL (file or stdout) or CSV (every column any row has: a column first met
    in a later row widens the header, and earlier rows get an empty cell)."""

    def __init__(self, path: str, fmt: str, *, append: bool) -> None:
        if fmt not in ("jsonl", "csv"):
            raise ValueError(
                "output must be .jsonl or .csv (Parquet output is not supported; convert with pandas)"
            )
        self.fmt = fmt
        self.path = path
        self._stdout = path == "-"
        self._fh: TextIO = (
            sys.stdout
            if self._stdout
            else open(path, "a" if append else "w", encoding="utf-8", newline="")  # noqa: SIM115
        )
        self._columns: list[str] | None = None
        self._sync = _Syncer()
        if fmt == "csv" and append and not self._stdout and Path(path).stat().st_size > 0:
            with open(path, newline="", encoding="utf-8") as fh:
                self._columns = next(csv.reader(fh))

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        if self.fmt == "jsonl":
            payload = "".join(
                json.dumps(jsonable(r, nan="none"), ensure_ascii=False, default=str) + "\n"
                for r in rows
            )
        else:
            buf = io.StringIO()
            if self._columns is None:
                self._columns = list(dict.fromkeys(c for r in rows for c in r))
                csv.writer(buf).writerow(self._columns)
            new = [c for r in rows for c in r if c not in self._columns]
            if new:
                self._add_columns(list(dict.fromkeys(new)))
            w = csv.writer(buf)
            for r in rows:
                w.writerow([_cell(r.get(c)) for c in self._columns])
            payload = buf.getvalue()
        self._fh.write(payload)
        if self._stdout:
            self._fh.flush()
        else:
            self._sync(self._fh)

    def _add_columns(self, new: list[str]) -> None:
        """Widen a CSV file's header for columns a later row brings (earlier rows: empty cells).

        A CSV header cannot grow in place, so the rows written so far are copied once into a file
        with the wider header, which then replaces the old one.
        """
        assert self._columns is not None
        self._columns = self._columns + new
        self._fh.flush()
        path = Path(self.path)
        self._fh.close()
        tmp = path.with_name(f".{path.name}.tmp")
        with (
            path.open(newline="", encoding="utf-8") as src,
            tmp.open("w", newline="", encoding="utf-8") as dst,
        ):
            reader = csv.reader(src)
            next(reader, None)
            w = csv.writer(dst)
            w.writerow(self._columns)
            for row in reader:
                w.writerow(row + [""] * len(new))
        tmp.replace(path)
        self._fh = open(path, "a", encoding="utf-8", newline="")  # noqa: SIM115

    def close(self) -> None:
        if not self._stdout:
            self._sync(self._fh, force=True)
            self._fh.close()


def _cell(v: Any) -> Any:
    if isinstance(v, list | dict):
        return json.dumps(v, ensure_ascii=False)
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    return v


class ErrorLog:
    """Bad rows as JSONL ``{"line", "id", "error"}`` in a file (or one line each on stderr)."""

    def __init__(self, path: Path | None, *, append: bool) -> None:
        self.path = path
        self.count = 0
        # Opened on the first bad row: a run without bad rows leaves no empty errors file behind.
        # Without append, an errors file of an earlier run is removed (it described other output).
        if path is not None and not append and path.exists():
            path.unlink()
        self._fh: TextIO | None = None
        self._sync = _Syncer()

    def write(self, line: int, error: str, row: dict[str, Any] | None = None) -> None:
        self.count += 1
        rec = {"line": line, "error": error}
        if row and row.get("id") is not None:
            rec["id"] = row["id"]
        if self.path is None:
            print(f"gnll score: input line {line}: {error}", file=sys.stderr)
            return
        if self._fh is None:
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._fh.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")

    def flush(self) -> None:
        if self._fh is not None:
            self._sync(self._fh)

    def close(self) -> None:
        if self._fh is not None:
            self._sync(self._fh, force=True)
            self._fh.close()
