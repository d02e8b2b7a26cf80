"""The files of a ``gnll eval`` run directory, read by evaluation, calibration and plots alike.

One home for their names (:class:`RunDir`: the writer, the lock, the cleaner and every reader use
it) and for reading ``samples.jsonl`` (one JSON record per question), so the reports of a run and
``gnll calibrate --from-run`` cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["RESULTS", "SAMPLES", "RunDir", "iter_samples", "samples_path"]

SAMPLES = "samples.jsonl"
RESULTS = "results.json"


@dataclass(frozen=True)
class RunDir:
    """A ``gnll eval`` run directory and the name of every file in it.

    >>> run = RunDir("runs/x")
    >>> run.samples.as_posix(), run.task("svamp_short").as_posix()
    ('runs/x/samples.jsonl', 'runs/x/tasks/svamp_short')
    >>> "tasks/*/cache/*.jsonl" in RunDir.own_files()
    True
    """

    path: Path

    #: Top-level entries a run writes (and clears when starting over).
    ENTRIES = ("run.json", "components.json", "tasks", SAMPLES, RESULTS, "table.md", "plots",
               "timings.json")  # fmt: skip

    def __init__(self, path: str | Path) -> None:
        object.__setattr__(self, "path", Path(path))

    @property
    def run_json(self) -> Path:
        """The configuration of the run (written once every fingerprint is checked)."""
        return self.path / "run.json"

    @property
    def components(self) -> Path:
        """What the model, judges and clusterer were (written on their first use)."""
        return self.path / "components.json"

    @property
    def samples(self) -> Path:
        """One record per question: answers, correctness, measures."""
        return self.path / SAMPLES

    @property
    def results(self) -> Path:
        """The run's metrics (the file people share)."""
        return self.path / RESULTS

    @property
    def table(self) -> Path:
        """``results`` as a Markdown table."""
        return self.path / "table.md"

    @property
    def timings(self) -> Path:
        return self.path / "timings.json"

    @property
    def plots(self) -> Path:
        return self.path / "plots"

    def task(self, name: str) -> Path:
        """A task's folder: its fingerprint and the stages' caches."""
        return self.path / "tasks" / name

    @staticmethod
    def own_files() -> tuple[str, ...]:
        """Paths (relative, ``/``-separated, with ``*``) of every file an evaluation writes."""
        top = tuple(e for e in RunDir.ENTRIES if e not in ("tasks", "plots"))
        return (*top, "tasks/*/fingerprint.json", "tasks/*/*.json", "tasks/*/cache/*.jsonl",
                "plots/*.png")  # fmt: skip


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
