"""Calibrated probabilities of being correct and abstention thresholds for an uncertainty score.

``Calibrator`` (scikit-learn style ``fit`` / ``predict_proba`` / ``save`` / ``load``) maps G-NLL (or
any measure) to P(correct) with isotonic regression or Platt scaling, picked by cross-validated
log-loss; it reports held-out ECE, Brier score, log-loss and AUROC, and fits abstention thresholds
with finite-sample guarantees (:mod:`gnll.calibration.thresholds`). ``calibrate_files`` does the
whole job for ``gnll calibrate``.

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(1)
>>> g = rng.exponential(1.0, 1000); y = rng.uniform(size=1000) < np.exp(-g)
>>> cal = Calibrator().fit(g, y)
>>> cal.method_ in ("isotonic", "platt"), bool(cal.predict_proba([0.1])[0] > cal.predict_proba([3.0])[0])
(True, True)
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gnll.calibration.data import LabelledScores, load_labelled, prompt_fingerprint
from gnll.calibration.fitting import CalibrationMismatchWarning, Calibrator
from gnll.calibration.thresholds import Threshold, accuracy_threshold, coverage_threshold

__all__ = [
    "CalibrationMismatchWarning",
    "Calibrator",
    "LabelledScores",
    "Threshold",
    "accuracy_threshold",
    "calibrate_files",
    "coverage_threshold",
    "load_labelled",
    "prompt_fingerprint",
]


def calibrate_files(
    paths: list[str | Path],
    *,
    measure: str = "g-nll",
    correctness: str | None = None,
    model: str | None = None,
    **params: Any,
) -> tuple[Calibrator, LabelledScores]:
    """Fit a :class:`Calibrator` on eval runs / scored files and record where its data came from."""
    data = load_labelled(paths, measure=measure, correctness=correctness)
    if len(data.scores) == 0:
        raise ValueError(
            f"no labelled rows with a finite {measure!r} in {', '.join(map(str, paths))}"
        )
    cal = Calibrator(**params).fit(data.scores, data.labels)
    cal.meta = {
        "measure": measure,
        "model": model or data.model,
        "prompt_fingerprint": data.prompt_fingerprint,
        "prompt_format": data.prompt_format,
        "data": {
            "n": int(len(data.scores)),
            "n_correct": int(data.labels.sum()),
            "dropped": data.dropped,
            "sources": data.sources,
        },
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    return cal, data
