"""Small helpers every layer may use: the cache root, package lookup, atomic writes, JSON, progress.

This module imports nothing from gnll, so any module can import it without creating a cycle.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

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


def atomic_write(path: str | os.PathLike[str], data: str | bytes, *, fsync: bool = True) -> Path:
    """Write ``data`` to ``path`` via a temporary file in the same directory and a rename.

    Readers see the old file or the new one, never half of one; a crash leaves no partial file
    under ``path``. The parent directory is created if needed.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> atomic_write(f"{d}/a/b.txt", "hi").read_text()
    'hi'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(
    path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2, allow_nan: bool = True
) -> Path:
    """Write ``obj`` as JSON (UTF-8, trailing newline) with :func:`atomic_write`."""
    text = json.dumps(obj, ensure_ascii=False, indent=indent, allow_nan=allow_nan)
    return atomic_write(path, text + "\n")


def jsonable(obj: Any, *, nan: str = "keep") -> Any:
    """``obj`` as plain JSON types: numpy scalars/arrays to Python, tuples to lists, keys to str.

    ``nan="none"`` turns NaN and infinities into ``None`` (strict JSON); ``nan="keep"`` leaves
    them (Python's ``json`` writes ``NaN``). Anything else unknown becomes its ``str``.

    >>> import numpy as np
    >>> jsonable({1: (np.float64(0.5), float("nan"))}, nan="none")
    {'1': [0.5, None]}
    """
    if nan not in ("keep", "none"):
        raise ValueError(f"nan must be 'keep' or 'none', got {nan!r}")
    if isinstance(obj, dict):
        return {str(k): jsonable(v, nan=nan) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v, nan=nan) for v in obj]
    if hasattr(obj, "tolist") and hasattr(obj, "dtype"):  # numpy arrays and scalars
        return jsonable(obj.tolist(), nan=nan)
    if isinstance(obj, float):
        return None if nan == "none" and not math.isfinite(obj) else obj
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    return str(obj)


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
