"""What a valid token log-prob is: the one check every layer uses (measures, backends, scoring, serving).

A token log-prob is finite, at most 0 (a hair above 0 is float round-off in a log-softmax or a
server's rounding, and is clamped to 0), present (not ``null``), and not the ``-9999`` that servers
send in place of -inf. Callers wrap :class:`LogprobError` in their own error type when they need one;
the message already names the place, the token and the value.

Example
-------
>>> check_logprobs([-0.5, 5e-6]).tolist()
[-0.5, 0.0]
>>> check_logprobs([-0.5, 0.3], where="answer 2", tokens=["Par", "is"])
Traceback (most recent call last):
...
gnll.measures.logprobs.LogprobError: answer 2: token 1 'is' has a positive log-probability (0.3); pass log-probabilities (<= 0), not probabilities or logits
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "LOGPROB_TOLERANCE",
    "SENTINEL_LOGPROB",
    "LogprobError",
    "ValidLogprobs",
    "check_logprobs",
]

#: Log-probs up to this far above 0 are round-off (log-softmax of a near-certain token, a server's
#: printed digits) and count as 0; anything larger is a bug upstream (probabilities or logits).
LOGPROB_TOLERANCE = 1e-4
#: vLLM clamps -inf to -9999.0 and llama.cpp sends the lowest float: anything this low is a sentinel.
SENTINEL_LOGPROB = -9999.0


class LogprobError(ValueError):
    """A token log-prob no measure can be computed from.

    ``kind`` says which rule it broke: ``"missing"``, ``"non-finite"``, ``"sentinel"`` or
    ``"positive"`` (callers add remedies by kind, e.g. a server's logprobs mode for a sentinel);
    ``"invalid"`` when a caller raises it for another reason.
    """

    def __init__(self, message: str, kind: str = "invalid") -> None:
        super().__init__(message)
        self.kind = kind


def _token(i: int, tokens: Sequence[str] | None) -> str:
    return f"token {i} {tokens[i]!r}" if tokens is not None and i < len(tokens) else f"token {i}"


class ValidLogprobs(np.ndarray):
    """Token log-probs that passed :func:`check_logprobs`: read-only float64, round-off clamped to 0.

    The value type says "already checked", so an answer's log-probs are validated once however many
    layers read them (its G-NLL, its spans, its ``uncertainty`` record): :func:`check_logprobs`
    returns one as it is. Slices stay valid; arithmetic on them gives plain arrays (a sum or a
    scaled copy is no longer a sequence of checked log-probs).

    >>> v = check_logprobs([-0.5, 5e-6])
    >>> isinstance(v, ValidLogprobs), check_logprobs(v) is v, type(v * 2).__name__
    (True, True, 'ndarray')
    """

    def __array_wrap__(
        self, array: np.ndarray, context: Any = None, return_scalar: bool = False
    ) -> Any:
        result = super().__array_wrap__(array, context, return_scalar)
        if not isinstance(result, np.ndarray):
            return result
        plain = result.view(np.ndarray)
        return plain[()] if return_scalar and plain.ndim == 0 else plain


def check_logprobs(
    values: Sequence[Any] | np.ndarray,
    *,
    where: str = "token_logprobs",
    tokens: Sequence[str] | None = None,
) -> ValidLogprobs:
    """Validate one sequence of token log-probs; return it as float64, round-off clamped to 0.

    Values that were checked already (a :class:`ValidLogprobs`) are returned as they are.

    Parameters
    ----------
    values
        The log-probs of one output's tokens.
    where
        Where they come from, first in any error message (``"prompt 3"``, ``"answer 'Paris'"``).
    tokens
        The tokens, to name the offending one in the message.

    Raises
    ------
    LogprobError
        For a missing (``None``), NaN or infinite value, a value at or below
        :data:`SENTINEL_LOGPROB`, or one above :data:`LOGPROB_TOLERANCE`.
    TypeError, ValueError
        For a string or anything that is not a flat sequence of numbers.
    """
    if isinstance(values, ValidLogprobs):
        return values
    return _validate(values, where, tokens)


def _validate(
    values: Sequence[Any] | np.ndarray, where: str, tokens: Sequence[str] | None
) -> ValidLogprobs:
    if isinstance(values, str | bytes):
        raise TypeError(f"{where} must be a sequence of floats, got a string")
    try:
        arr = np.asarray(values, dtype=np.float64)  # None becomes NaN: told apart below
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where} must be a sequence of floats: {exc}") from exc
    if arr.ndim != 1:
        raise ValueError(
            f"{where} must be one-dimensional (one log-prob per token), got shape {arr.shape}"
        )
    bad = ~np.isfinite(arr)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        if not isinstance(values, np.ndarray) and values[i] is None:
            raise LogprobError(f"{where}: {_token(i, tokens)} has no log-prob (null)", "missing")
        raise LogprobError(
            f"{where}: {_token(i, tokens)} has a non-finite log-prob ({arr[i]}); log-probs must be "
            "finite (a -inf means the model gave the chosen token zero probability)",
            "non-finite",
        )
    if (arr <= SENTINEL_LOGPROB).any():
        i = int(np.flatnonzero(arr <= SENTINEL_LOGPROB)[0])
        raise LogprobError(
            f"{where}: {_token(i, tokens)} has log-prob {arr[i]}, at or below {SENTINEL_LOGPROB:g}, "
            "the stand-in servers send for -inf (probability 0): the token could not have been "
            "generated from the raw distribution",
            "sentinel",
        )
    if (arr > LOGPROB_TOLERANCE).any():
        i = int(np.flatnonzero(arr > LOGPROB_TOLERANCE)[0])
        raise LogprobError(
            f"{where}: {_token(i, tokens)} has a positive log-probability ({arr[i]:.6g}); "
            "pass log-probabilities (<= 0), not probabilities or logits",
            "positive",
        )
    valid = np.minimum(arr, 0.0).view(ValidLogprobs)
    valid.flags.writeable = False
    return valid
