"""Append-only, flushed JSONL stage caches keyed by (split, position).

A stage cache file starts with a header line ``{"_header": {...}}`` holding the configuration that
produced it (its name carries a hash of that configuration, so a different configuration never
shares a file). Each further line is one question's record ``{"k": [split, pos], "id": ...}``.
Only byte offsets are kept in memory; records are read back on demand. A torn last line (the process was
killed mid-write: it has no newline) is cut off when the cache is reopened; any other damaged line
is an error naming the file and line, since dropping it would lose the records after it.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "greedy-abc.jsonl"
>>> c = JsonlCache(p, {"stage": "greedy"})
>>> c.append([{"k": ["eval", 0], "id": "q0", "text": "Paris"}])
>>> JsonlCache(p, {"stage": "greedy"}).get(("eval", 0))["text"]
'Paris'
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# The atomic writers live in gnll._util (one home for every layer); re-exported for the run store.
from gnll._util import atomic_file, fsync_dir, write_json_atomic, write_text_atomic

__all__ = [
    "CacheDamagedError",
    "CacheMismatchError",
    "JsonlCache",
    "atomic_file",
    "fsync_dir",
    "write_json_atomic",
    "write_text_atomic",
]

Key = tuple[str, int]


class CacheMismatchError(RuntimeError):
    """A cache on disk was produced by a different configuration."""


class CacheDamagedError(ValueError):
    """A complete line of a cache file is not a valid record (the message names file and line)."""


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=True)


class JsonlCache:
    """One stage's cache: ``has``/``get`` by key, ``append`` records (flushed, fsynced)."""

    def __init__(self, path: str | Path, header: dict[str, Any]) -> None:
        self.path = Path(path)
        self.header = header
        self._offsets: dict[Key, int] = {}
        #: When a torn last record was cut at load, the key of the complete record before it: the
        #: append that was cut short may have left whole records up to (and including) this one.
        self.torn_after: Key | None = None
        self._fh = None
        if self.path.exists():
            self._load()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write_header()

    def _load(self) -> None:
        with self.path.open("rb") as fh:
            first = fh.readline()
            if not first.endswith(b"\n") and not fh.read(1):
                # Killed while creating the file: only a partial header, which this class wrote.
                self._write_header()
                return
            stored = _header_of(first)
            if stored is None:
                raise CacheDamagedError(
                    f"{self.path}:1: not a gnll stage cache (its first line is not a header); "
                    "move the file out of the run directory"
                )
            if _canon(stored) != _canon(self.header):
                raise CacheMismatchError(
                    f"{self.path} was written by a different configuration:\n"
                    f"  on disk: {_dumps(stored)}\n  now:     {_dumps(self.header)}"
                )
            good_end = fh.tell()
            lineno = 1
            last: Key | None = None
            while True:
                offset = fh.tell()
                line = fh.readline()
                if not line:
                    break
                lineno += 1
                if not line.endswith(b"\n"):
                    self.torn_after = last  # killed while appending: a torn last record
                    break
                last = _key_of(line, self.path, lineno)
                self._offsets[last] = offset
                good_end = fh.tell()
        if good_end < self.path.stat().st_size:
            with self.path.open("r+b") as fh:
                fh.truncate(good_end)

    def _write_header(self) -> None:
        with self.path.open("w", encoding="utf-8") as out:
            out.write(_dumps({"_header": self.header}) + "\n")
            out.flush()
            os.fsync(out.fileno())
        fsync_dir(self.path.parent)

    def __len__(self) -> int:
        return len(self._offsets)

    def has(self, key: Key) -> bool:
        return key in self._offsets

    def may_be_torn(self, keys: Iterable[Key]) -> bool:
        """Whether the records of ``keys`` on disk may be the rest of an append a kill cut short
        (they hold the last whole record before a torn one); otherwise each append they came from
        is complete, e.g. an earlier run with a smaller ``--limit``."""
        return self.torn_after is not None and self.torn_after in set(keys)

    def missing(self, keys: Iterable[Key]) -> list[Key]:
        return [k for k in keys if k not in self._offsets]

    def get(self, key: Key) -> dict[str, Any]:
        offset = self._offsets[key]
        with self.path.open("rb") as fh:
            fh.seek(offset)
            return json.loads(fh.readline())

    def get_many(self, keys: Iterable[Key]) -> list[dict[str, Any]]:
        out = []
        with self.path.open("rb") as fh:
            for key in keys:
                fh.seek(self._offsets[key])
                out.append(json.loads(fh.readline()))
        return out

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        lines = []
        keys = []
        for rec in records:
            key = (rec["k"][0], int(rec["k"][1]))
            keys.append(key)
            lines.append(_dumps(rec) + "\n")
        if not lines:
            return
        with self.path.open("ab") as fh:
            offset = fh.tell()
            payload = [line.encode("utf-8") for line in lines]
            fh.write(b"".join(payload))
            fh.flush()
            os.fsync(fh.fileno())
        for key, data in zip(keys, payload, strict=True):
            self._offsets[key] = offset
            offset += len(data)


def _header_of(line: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(line)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return None
    return (
        obj["_header"] if isinstance(obj, dict) and isinstance(obj.get("_header"), dict) else None
    )


def _key_of(line: bytes, path: Path, lineno: int) -> Key:
    """The key of one complete record line; a damaged line is an error, never skipped.

    Skipping it (or cutting the file there) would silently drop the records after it.
    """
    try:
        rec = json.loads(line)
        split, pos = rec["k"]
        if isinstance(split, str) and isinstance(pos, int) and not isinstance(pos, bool):
            return split, pos
        problem = f"its key {rec['k']!r} is not [split, position]"
    except UnicodeDecodeError:
        problem = "not valid UTF-8"
    except json.JSONDecodeError as exc:
        problem = f"not valid JSON ({exc.msg}, column {exc.colno})"
    except (KeyError, TypeError, ValueError):
        problem = "not a record with a key 'k': [split, position]"
    raise CacheDamagedError(
        f"{path}:{lineno}: damaged cache record ({problem}); the records after it are kept. "
        "Delete that line (or the whole file, to recompute this stage) and resume"
    )


def _canon(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False)
