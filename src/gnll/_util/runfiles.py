"""The files of a ``gnll eval`` run directory, read by evaluation, calibration and plots alike.

One home for their names and for reading ``samples.jsonl`` (one JSON record per question), so the
reports of a run and ``gnll calibrate --from-run`` cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["RESULTS", "SAMPLES", "iter_samples", "samples_path"]

SAMPLES = "samples.jsonl"
RESULTS = "results.json"


def samples_path(path: str | Path) -> Path:
    """``samples.jsonl`` of a run directory (or ``path`` itself when it is a file)."""
    p = Path(path)
    return p / SAMPLES if p.is_dir() else p


def iter_samples(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` for every line of a run's ``samples.jsonl``.

    A line that is not a JSON object is one ``ValueError`` naming the file and line.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / SAMPLES).write_text('{"task": "t"}\\n')
    >>> list(iter_samples(d))
    [(1, {'task': 't'})]
    """
    p = samples_path(path)
    with p.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{p}:{lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{p}:{lineno}: not a JSON object")
            yield lineno, record
