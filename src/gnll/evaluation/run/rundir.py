"""The run directory: one run at a time, and nothing deleted that gnll did not write.

:class:`RunLock` holds an exclusive lock on ``<output_path>/.gnll.lock`` for a run's lifetime; a
second run on the same directory fails at once with a message naming the process that holds it.
The operating system releases the lock when the process ends in any way (``kill -9`` included),
so there is never a stale lock to remove by hand.

:func:`clear_previous_run` starts a directory over (a run without ``--resume``): it deletes the
files of an earlier run only if every one of them is a file gnll writes; anything else (a note, a
notebook, files of another tool) makes it refuse before deleting anything.

>>> import tempfile, pathlib
>>> out = pathlib.Path(tempfile.mkdtemp())
>>> with RunLock(out):
...     try:
...         RunLock(out).acquire()
...     except RunDirectoryBusyError as exc:
...         print("busy")
busy
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import socket
import time
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from filelock import FileLock, Timeout

from gnll._util.runfiles import RunDir

__all__ = [
    "ForeignFilesError",
    "RunDirectoryBusyError",
    "RunLock",
    "clear_previous_run",
    "written_by_gnll",
]

LOCK_NAME = ".gnll.lock"
OWNER_NAME = ".gnll.owner"

#: Paths (relative to the run directory, ``/``-separated) of every file an evaluation writes.
#: Temporary files of the atomic writer (``.<name>.<random>.tmp``) count as gnll's too.
OWN_FILES = RunDir.own_files()


class RunDirectoryBusyError(RuntimeError):
    """Another gnll process is running in this output directory."""


class ForeignFilesError(RuntimeError):
    """Starting a directory over would delete files gnll did not write."""


class RunLock:
    """Exclusive, process-lifetime lock on a run directory (a context manager)."""

    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        self._lock = FileLock(str(self.out / LOCK_NAME), timeout=0)

    def acquire(self) -> RunLock:
        self.out.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise RunDirectoryBusyError(
                f"{self.out} is in use by another gnll run ({self._owner()}); wait for it to "
                "finish, or give this run another --output"
            ) from None
        owner = f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%H:%M:%S')}"
        (self.out / OWNER_NAME).write_text(owner + "\n", encoding="utf-8")
        return self

    def check_free(self) -> None:
        """Raise :class:`RunDirectoryBusyError` if another run holds the directory; creates nothing
        where no run ever was (a check before the model loads)."""
        if (self.out / LOCK_NAME).exists():
            self.acquire().release()

    def release(self) -> None:
        if self._lock.is_locked:
            (self.out / OWNER_NAME).unlink(missing_ok=True)
            self._lock.release()

    def _owner(self) -> str:
        try:
            return (self.out / OWNER_NAME).read_text(encoding="utf-8").strip()
        except OSError:
            return "owner unknown"

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def written_by_gnll(rel: str) -> bool:
    """Whether the file at ``rel`` (relative to a run directory) is one gnll writes.

    >>> [written_by_gnll(p) for p in ("table.md", "tasks/x/cache/greedy-ab.jsonl",
    ...                                "plots/roc.png", "plots/notes.txt", "tasks/x/my.csv",
    ...                                ".table.md.k3j_x.tmp", ".notes.abc.tmp")]
    [True, True, True, False, False, True, False]
    """
    path = PurePosixPath(rel)
    if path.name.startswith(".") and path.name.endswith(".tmp"):
        # the atomic writer's temporary file for an own file: ".<name>.<random>.tmp"
        real = path.name[1:-4].rsplit(".", 1)[0]
        return bool(real) and written_by_gnll((path.parent / real).as_posix())
    return any(fnmatch.fnmatchcase(rel, pat) for pat in OWN_FILES)


def clear_previous_run(out: str | Path, entries: tuple[str, ...]) -> list[str]:
    """Delete the earlier run's ``entries`` in ``out``; refuse if any holds a foreign file.

    Returns the entries removed. Nothing is deleted unless every file under them was written
    by gnll (:func:`written_by_gnll`); the caller must hold the directory's :class:`RunLock`.
    """
    out = Path(out)
    present = [e for e in entries if (out / e).exists() or (out / e).is_symlink()]
    files: list[str] = []
    for entry in present:
        p = out / entry
        if p.is_symlink() or not p.is_dir():
            files.append(entry)
            continue
        for root, dirs, names in os.walk(p):
            links = [d for d in dirs if (Path(root) / d).is_symlink()]
            files += [(Path(root) / n).relative_to(out).as_posix() for n in names + links]
    foreign = [f for f in files if (out / f).is_symlink() or not written_by_gnll(f)]
    if foreign:
        shown = ", ".join(foreign[:5]) + (
            f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        )
        raise ForeignFilesError(
            f"{out} holds files gnll did not write ({shown}); nothing was deleted. Move them "
            "away, continue the earlier run with --resume, or choose another --output"
        )
    for entry in present:
        p = out / entry
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    for tmp in out.glob(".*.tmp"):  # left by a killed run
        if written_by_gnll(tmp.name):
            tmp.unlink(missing_ok=True)
    return present


def changed_tasks(run_json: Path, out: Path, tasks: Sequence[str]) -> str | None:
    """What a resume with other ``--tasks`` than the run it continues does, in one line: the tasks
    it adds, and those it leaves out of ``samples.jsonl``, ``results.json`` and ``table.md``
    (their work stays in ``tasks/`` and comes back when they are named again); ``None`` when the
    tasks are the same or no earlier ``run.json`` says what they were."""
    try:
        before = list(json.loads(run_json.read_text())["config"]["tasks"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    now = list(tasks)
    added = [t for t in now if t not in before]
    left = [t for t in before if t not in now]
    if not (added or left):
        return None
    parts = [f"adding {', '.join(added)}"] if added else []
    if left:
        parts.append(
            f"leaving out {', '.join(left)} (its work stays in {out}/tasks/; pass --tasks "
            f"{','.join([*before, *added])} to keep it in the results)"
        )
    return f"{out} was a run of {','.join(before)}; this resume runs {','.join(now)}: " + (
        "; ".join(parts)
    )
