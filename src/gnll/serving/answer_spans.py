"""``uncertainty.spans``: the NLL of each sentence of an answer, or of each field of a JSON answer.

An answer that holds a JSON object or array is split into its field values (JSON paths), any other
into sentences (:mod:`gnll.spans`). Offsets are in characters of the answer's text as the model wrote
it; a refused answer gets none (they would reveal its text). Sampled answers get spans too: their
NLL then splits the sample's NLL, not a G-NLL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gnll.spans import span_nlls

__all__ = ["add_spans"]


def add_spans(
    record: dict[str, Any], text: str, tokens: Sequence[str] | None, logprobs: Any
) -> None:
    """Put ``spans``, ``spans_kind`` and ``least_certain_span`` (an index) into ``record``."""
    if not tokens or len(tokens) != len(logprobs):
        record.update(spans=None, spans_kind=None, least_certain_span=None)
        return
    lps = [float(x) for x in logprobs]
    try:
        report = span_nlls(list(tokens), lps, text, "json")
    except ValueError:
        report = span_nlls(list(tokens), lps, text, "sentence")
    spans = [
        {
            "path": s.path,
            "text": s.text,
            "start": s.start,
            "end": s.end,
            "nll": s.nll,
            "num_tokens": s.num_tokens,
        }
        for s in report.spans
    ]
    top = report.least_certain()
    record.update(
        spans=spans,
        spans_kind=report.kind,
        least_certain_span=report.spans.index(top) if top is not None else None,
    )
