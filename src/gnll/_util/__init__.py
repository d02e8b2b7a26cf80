"""Small helpers every layer may use: the cache root, package lookup, atomic writes, JSON, progress.

This module imports nothing from gnll, so any module can import it without creating a cycle.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

T = TypeVar("T")


def cache_dir() -> Path:
    """Root of gnll's cache: ``$GNLL_CACHE`` or ``~/.cache/gnll``.

    >>> import os; os.environ["GNLL_CACHE"] = "/tmp/x"; str(cache_dir())
    '/tmp/x'
    >>> del os.environ["GNLL_CACHE"]
    """
    return Path(os.environ.get("GNLL_CACHE") or Path.home() / ".cache" / "gnll")


def package_dir(module: str) -> Path | None:
    """Directory of an installed package, found without importing it (some print on import).

    >>> package_dir("json").name, package_dir("no_such_module_xyz")
    ('json', None)
    """
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def package_version(module: str) -> str:
    """Version of the distribution that installs the importable ``module`` (``"unknown"`` if none)."""
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    for dist in packages_distributions().get(module, []):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make renames and new entries in directory ``path`` survive a power loss (POSIX only)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows cannot open a directory; renames there are durable anyway
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """Open a uniquely named temporary file next to ``path``; on success fsync it, rename it to
    ``path`` and fsync the directory. Readers see the old file or the new one, never half of one,
    and two writers never share a temporary file. On error the temporary file is removed.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write(path: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write ``data`` to ``path`` with :func:`atomic_file`, creating the parent directory if needed.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> atomic_write(f"{d}/a/b.txt", "hi").read_text()
    'hi'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w") as fh:
        fh.write(data)
    return path


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) with :func:`atomic_file`."""
    with atomic_file(path) as fh:
        fh.write(text)


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> None:
    """Write JSON (NaN allowed, trailing newline) with :func:`atomic_file`."""
    with atomic_file(path) as fh:
        json.dump(obj, fh, ensure_ascii=False, indent=indent, allow_nan=True)
        fh.write("\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    """The JSON in ``path``; a damaged or cut-short file is a ``ValueError`` that names it.

    >>> p = Path(tempfile.mkdtemp()) / "data.json"
    >>> _ = p.write_text('{"a": [1, 2')
    >>> read_json(p)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: .../data.json is not valid JSON (Expecting ',' delimiter, line 1 column 12): ...
    """
    text = Path(path).read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        what = (
            "empty"
            if not text.strip()
            else f"not valid JSON ({e.msg}, line {e.lineno} column {e.colno})"
        )
        raise ValueError(
            f"{path} is {what}: the file is damaged or was cut short (e.g. by a crash or a full "
            "disk while it was written)"
        ) from None


def read_artifact(path: str | os.PathLike[str], what: str, parse: Callable[[Any], T]) -> T:
    """``parse`` of the JSON file ``path`` (a calibration, a cascade threshold, ...): a missing file
    is a ``FileNotFoundError`` naming ``what`` it should hold, a damaged one or one ``parse``
    rejects a ``ValueError`` naming the file.

    >>> read_artifact("/nonexistent/cal.json", "calibration file", dict)
    Traceback (most recent call last):
    FileNotFoundError: calibration file /nonexistent/cal.json does not exist
    """
    path = Path(path)
    try:
        data = read_json(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} does not exist") from None
    try:
        return parse(data)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB blocks (data files, checkpoint files)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def jsonable(obj: Any, *, nan: str = "keep") -> Any:
    """``obj`` as it reads back from JSON: numpy scalars/arrays to Python, tuples to lists.

    The one JSON converter of the package (results, fingerprints, component descriptions, the
    simulation study, calibration files). Keys become strings as ``json`` writes them
    (``True`` -> ``"true"``). ``nan="none"`` turns NaN and infinities into ``None`` (strict JSON);
    ``nan="keep"`` leaves them (Python's ``json`` writes ``NaN``). Anything else unknown becomes
    its ``str``.

    >>> import numpy as np
    >>> jsonable({1: (np.float64(0.5), float("nan")), None: np.int64(2)}, nan="none")
    {'1': [0.5, None], 'null': 2}
    """
    if nan not in ("keep", "none"):
        raise ValueError(f"nan must be 'keep' or 'none', got {nan!r}")
    if isinstance(obj, dict):
        return {_json_key(k): jsonable(v, nan=nan) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v, nan=nan) for v in obj]
    if hasattr(obj, "tolist") and hasattr(obj, "dtype"):  # numpy arrays and scalars
        return jsonable(obj.tolist(), nan=nan)
    if isinstance(obj, float):
        return None if nan == "none" and not math.isfinite(obj) else obj
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    return str(obj)


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool | int | float):
        return json.dumps(key)  # what json.dump writes for such a key: true, null, 1.0, NaN
    return str(key)


def progress_enabled(requested: bool = True) -> bool:
    """Whether to draw progress bars: asked for, and not switched off by ``GNLL_NO_PROGRESS=1``."""
    return bool(requested) and os.environ.get("GNLL_NO_PROGRESS") != "1"


def progress(items: Iterable[T], enabled: bool, desc: str, *, unit: str = "it") -> Iterator[T]:
    """``items`` with a tqdm bar when :func:`progress_enabled` (and more than one item is known)."""
    items = list(items)
    if not progress_enabled(enabled) or len(items) <= 1:
        yield from items
        return
    from tqdm.auto import tqdm

    yield from tqdm(items, desc=desc, unit=unit)
