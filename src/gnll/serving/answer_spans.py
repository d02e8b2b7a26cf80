"""``uncertainty.spans``: the NLL of each sentence of an answer, or of each field of a JSON answer.

An answer that holds a JSON object or array is split into its field values (JSON paths), any other
into sentences (:mod:`gnll.spans`). Offsets are in characters of the answer's text as the model wrote
it; a refused answer gets none (they would reveal its text). Sampled answers get spans too: their
NLL then splits the sample's NLL, not a G-NLL. The fields are named as on every surface
(:func:`gnll.uncertainty.span_fields`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gnll.measures.logprobs import check_logprobs
from gnll.spans import SpanReport, span_nlls

__all__ = ["answer_spans"]


def answer_spans(
    text: str, tokens: Sequence[str] | None, logprobs: Sequence[float] | np.ndarray
) -> SpanReport | None:
    """The answer's JSON field spans if it holds JSON, else its sentences (``None`` without tokens
    that line up with the log-probs)."""
    if not tokens or len(tokens) != len(logprobs):
        return None
    lps = check_logprobs(logprobs, where="answer", tokens=tokens)  # as it is when checked already
    try:
        return span_nlls(list(tokens), lps, text, "json")
    except ValueError:
        return span_nlls(list(tokens), lps, text, "sentence")
