"""The abstention policy and the annotation of answers now live in :mod:`gnll.policy` (below
``gnll.scoring``, so every surface obeys the same object); this name keeps older imports working."""

from gnll.policy import (
    DEFAULT_REFUSAL,
    MODES,
    AbstentionPolicy,
    Mode,
    add_early,
    annotate,
    apply_policy,
    headers_for,
    reasoning_fields,
    uncertainty_record,
)

__all__ = [
    "DEFAULT_REFUSAL",
    "MODES",
    "AbstentionPolicy",
    "Mode",
    "add_early",
    "annotate",
    "apply_policy",
    "headers_for",
    "reasoning_fields",
    "uncertainty_record",
]
