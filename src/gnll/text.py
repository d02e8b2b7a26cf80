"""Answer text shared by correctness metrics and clustering: SQuAD normalisation and numbers.

This follows the official SQuAD v1.1 evaluation script (lower-case, drop punctuation, drop the articles
a/an/the, collapse white space), which is also what TriviaQA's ``normalize_answer`` does up to its treatment
of underscores. It lives at the bottom of the package because both :mod:`gnll.semantic` (the exact-match
clusterer) and :mod:`gnll.evaluation` (SQuAD F1) need the same definition.

The one number grammar (:data:`NUMBER`, :func:`numbers_in`, :func:`as_number`) is here for the same
reason: SVAMP's numeric correctness and the embedding clusterer's number veto must agree on which
number an answer contains.
"""

from __future__ import annotations

import re
import string

__all__ = ["NUMBER", "answer_tokens", "as_number", "normalize_answer", "numbers_in"]

_ARTICLES = re.compile(r"\b(a|an|the)\b", flags=re.UNICODE)
_PUNCT = set(string.punctuation) | {"‘", "’", "´", "`", "“", "”", "–", "—"}


def normalize_answer(text: str) -> str:
    """Return the SQuAD-normalised form of ``text``.

    Parameters
    ----------
    text:
        Any answer string.

    Returns
    -------
    str
        Lower-cased text without punctuation or articles, single-space separated.

    Examples
    --------
    >>> normalize_answer("  The Eiffel-Tower! ")
    'eiffeltower'
    >>> normalize_answer("An apple, a day")
    'apple day'
    """
    if not isinstance(text, str):
        raise TypeError(f"normalize_answer expects a str, got {type(text).__name__}")
    text = text.lower().replace("_", " ")
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def answer_tokens(text: str) -> list[str]:
    """White-space tokens of the normalised answer (the unit of SQuAD F1)."""
    return normalize_answer(text).split()


#: A run of digits with ``.`` and ``,`` inside, optionally signed. A sign counts only when it does not
#: follow a word character or ``)`` (``26-14`` is 26 and 14; ``x = -3`` is -3). :func:`numbers_in`
#: reads each run: ``,`` before groups of exactly three digits separates thousands (``1,500``), a
#: single comma before other digits is a decimal comma (``1,5``), and anything else is a list
#: (``1,2,3``).
NUMBER = r"(?:(?<![\w)])[-+])?(?:\d[\d.,]*\d|\d|\.\d+)"
_NUMBER_RE = re.compile(NUMBER)
_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_PLAIN = re.compile(r"\d*\.?\d+")
_DECIMAL_COMMA = re.compile(r"\d+,\d+")


def _values(token: str) -> list[float]:
    sign = -1.0 if token[0] == "-" else 1.0
    body = token.lstrip("+-")
    if _THOUSANDS.fullmatch(body):
        values = [float(body.replace(",", ""))]
    elif _PLAIN.fullmatch(body):
        values = [float(body)]
    elif _DECIMAL_COMMA.fullmatch(body):
        values = [float(body.replace(",", "."))]
    else:  # a list such as 1,2,3 or a dotted run such as 1.2.3: its parts
        values = [float(x) for part in body.split(",") for x in _split_dots(part)]
    values[0] *= sign
    return values


def _split_dots(part: str) -> list[str]:
    return [part] if _PLAIN.fullmatch(part) else [x for x in part.split(".") if x]


def numbers_in(text: str) -> list[float]:
    """Every number written with digits in ``text``, in order.

    Examples
    --------
    >>> numbers_in("-3 apples, 1,500 pears and 2.5 kg")
    [-3.0, 1500.0, 2.5]
    >>> numbers_in("26 - 14 = 12; 5-3; 1,5 l; 1,2,3")
    [26.0, 14.0, 12.0, 5.0, 3.0, 1.5, 1.0, 2.0, 3.0]
    """
    return [v for m in _NUMBER_RE.finditer(text) for v in _values(m.group())]


def as_number(text: str) -> float | None:
    """The number ``text`` is, if it is nothing but one number (a trailing period is allowed).

    Examples
    --------
    >>> as_number(" -5.0. "), as_number("5 apples"), as_number("1,000"), as_number("1,2,3")
    (-5.0, None, 1000.0, None)
    """
    m = _NUMBER_RE.fullmatch(text.strip().rstrip(".").strip())
    if m is None:
        return None
    values = _values(m.group())
    return values[0] if len(values) == 1 else None
