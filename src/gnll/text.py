"""Answer-text normalisation shared by correctness metrics and lexical clustering.

This follows the official SQuAD v1.1 evaluation script (lower-case, drop punctuation, drop the articles
a/an/the, collapse white space), which is also what TriviaQA's ``normalize_answer`` does up to its treatment
of underscores. It lives at the bottom of the package because both :mod:`gnll.semantic` (the exact-match
clusterer) and :mod:`gnll.evaluation` (SQuAD F1) need the same definition.
"""

from __future__ import annotations

import re
import string

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
