"""The one check of paired scores and labels (AUROC, calibration maps and metrics, abstention rules)."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ParameterError", "check_scores_labels"]


class ParameterError(ValueError):
    """A library object's parameter ``param`` has a value it cannot take.

    The message starts with the parameter's name, so a command line can name its option for it
    (``--`` + the message) while a Python caller reads the parameter's own name: every entry point
    gets the same check, made by the object itself (scikit-learn's ``_validate_params`` pattern).

    ``others`` names the other parameters the message mentions by name (``"threshold"`` in "cannot
    be given with threshold"), so a command line can name their options too.

    >>> str(ParameterError("chunk_size", "must be >= 1, got 0"))
    'chunk_size must be >= 1, got 0'
    """

    def __init__(self, param: str, problem: str, *, others: tuple[str, ...] = ()) -> None:
        super().__init__(f"{param} {problem}")
        self.param = param
        self.problem = problem
        self.others = others


def check_scores_labels(
    scores: Any,
    labels: Any,
    *,
    names: tuple[str, str] = ("scores", "labels"),
    binary: bool = True,
    probabilities: bool = False,
    nonempty: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """``scores`` and ``labels`` as float64 arrays, or one ``ValueError`` saying what is wrong.

    Both must be 1-D and of equal length, the scores finite. ``binary``: labels are 0/1 (or
    booleans); otherwise any number (a fractional correctness, thresholded by the caller).
    ``probabilities``: the scores are probabilities, inside [0, 1]. ``nonempty``: at least one row.

    >>> check_scores_labels([0.5, 2.0], [True, False])[1].tolist()
    [1.0, 0.0]
    >>> check_scores_labels([0.5, float("nan")], [1, 0])
    Traceback (most recent call last):
    ...
    ValueError: scores contain NaN or inf; drop those rows first
    """
    s_name, y_name = names
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if s.ndim != 1 or s.shape != y.shape or (nonempty and len(s) == 0):
        what = "1-D, equal length" + (", non-empty" if nonempty else "")
        raise ValueError(f"{s_name} and {y_name} must be {what}; got {s.shape} and {y.shape}")
    if not np.all(np.isfinite(s)):
        raise ValueError(f"{s_name} contain NaN or inf; drop those rows first")
    if probabilities and (s.min(initial=0) < 0 or s.max(initial=0) > 1):
        raise ValueError(f"{s_name} are probabilities and must lie inside [0, 1]")
    if binary and not np.all((y == 0) | (y == 1)):
        raise ValueError(f"{y_name} must be 0/1 or booleans (1 = correct)")
    return s, y
