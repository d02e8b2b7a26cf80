"""Which tabular file format a path holds (``gnll score`` input and output, ``gnll calibrate`` files)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["FORMATS", "file_format"]

FORMATS = ("jsonl", "csv", "parquet")
_SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}


def file_format(path: str | Path, given: str | None = None) -> str:
    """The format from ``given`` or the file name (``-``, stdin/stdout: JSONL).

    >>> file_format("scores.pq"), file_format("-"), file_format("x.txt", "csv")
    ('parquet', 'jsonl', 'csv')
    """
    if given:
        if given not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {given!r}")
        return given
    if str(path) == "-":
        return "jsonl"
    suffix = Path(path).suffix.lower()
    fmt = _SUFFIXES.get(suffix)
    if fmt is None:
        raise ValueError(
            f"{path}: cannot tell the format from {suffix!r}; name it .jsonl/.csv/.parquet "
            "(gnll score: or pass --format)"
        )
    return fmt
