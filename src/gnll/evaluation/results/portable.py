"""What may go into files people share (``results.json``): no local absolute paths.

A path such as ``/home/alice/data/svamp/SVAMP.json`` tells others nothing they can use (the
file's SHA-256 identifies the data) and tells them about the author's machine; it is reduced to
its last component.

>>> without_local_paths({"file": "/home/alice/data/SVAMP.json", "n": 3, "url": "http://h/v1"})
{'file': 'SVAMP.json', 'n': 3, 'url': 'http://h/v1'}
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

__all__ = ["is_local_path", "without_local_paths"]

_ABSOLUTE = re.compile(r"^(/|~[/\\]|[A-Za-z]:[\\/]|\\\\)[^\n]*$")


def is_local_path(text: str) -> bool:
    """An absolute (or home-relative) file-system path on POSIX or Windows.

    >>> [is_local_path(s) for s in ("/tmp/x", "~/d", "C:\\\\data", "runs/x", "http://h/", "/")]
    [True, True, True, False, False, False]
    """
    return len(text) > 1 and bool(_ABSOLUTE.match(text))


def without_local_paths(obj: Any) -> Any:
    """``obj`` (JSON-like) with every absolute path string replaced by its last component."""
    if isinstance(obj, dict):
        return {k: without_local_paths(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [without_local_paths(v) for v in obj]
    if isinstance(obj, str) and is_local_path(obj):
        pure = PureWindowsPath(obj) if "\\" in obj else PurePosixPath(obj)
        return pure.name or obj
    return obj
