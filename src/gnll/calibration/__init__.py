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

from gnll.backends.prompting import check_format
from gnll.calibration.data import LabelledScores, load_labelled, prompt_fingerprint
from gnll.calibration.fitting import (
    CalibrationFormatError,
    CalibrationMismatchWarning,
    Calibrator,
    calibration_applies,
    scored_mismatch,
)
from gnll.calibration.thresholds import Threshold, accuracy_threshold, coverage_threshold

__all__ = [
    "CalibrationFormatError",
    "CalibrationMismatchWarning",
    "Calibrator",
    "LabelledScores",
    "Threshold",
    "accuracy_threshold",
    "calibrate_files",
    "calibration_applies",
    "scored_mismatch",
    "coverage_threshold",
    "load_calibration",
    "load_labelled",
    "prompt_fingerprint",
    "shipped_calibration",
]

#: Calibration files shipped with the package, one per embedded model (scripts/calibrate_embedded.py).
SHIPPED = Path(__file__).parent / "shipped"


def shipped_calibration(model: str) -> Path | None:
    """The shipped calibration file of an embedded model (``None`` if there is none)."""
    path = SHIPPED / f"{Path(model).name}.json"
    return path if path.is_file() else None


def load_calibration(
    spec: str | Path,
    *,
    model: str | None = None,
    prompt_fingerprint: str | None = None,
    prompt_format: str | None = None,
    prompt_description: str | None = None,
) -> Calibrator:
    """Load ``spec``: a calibration file, or ``"auto"`` for the file shipped for ``model``.

    Warns (:class:`CalibrationMismatchWarning`) when ``model`` or ``prompt_fingerprint`` differ
    from those the file was fitted on; raises :class:`CalibrationFormatError` when the file was
    fitted on another ``prompt_format`` (:mod:`gnll.backends.prompting`).
    """
    if str(spec) == "auto":
        path = shipped_calibration(model or "")
        if path is None:
            known = ", ".join(sorted(p.stem for p in SHIPPED.glob("*.json"))) or "none"
            raise FileNotFoundError(
                f"no shipped calibration for model {model!r} (shipped: {known}); fit one with "
                "`gnll calibrate RUN_DIR --output calibration.json` and pass that file"
            )
        spec = path
    return Calibrator.load(
        spec,
        model=model,
        prompt_fingerprint=prompt_fingerprint,
        prompt_format=prompt_format,
        prompt_description=prompt_description,
    )


def calibrate_files(
    paths: list[str | Path],
    *,
    measure: str = "g-nll",
    correctness: str | None = None,
    model: str | None = None,
    prompt_format: str | None = None,
    **params: Any,
) -> tuple[Calibrator, LabelledScores]:
    """Fit a :class:`Calibrator` on eval runs / scored files and record where its data came from.

    ``prompt_format``: the :mod:`prompt format <gnll.backends.prompting>` the answers were
    produced under, when the data does not say (eval runs: ``instruction``; scored files: their
    ``prompt_format`` column); a different one than the data's is refused.
    """
    data = load_labelled(paths, measure=measure, correctness=correctness)
    if prompt_format is not None:
        check_format(prompt_format)
        if data.prompt_format not in (None, prompt_format):
            raise ValueError(
                f"the data's answers come from {data.prompt_format!r} prompts, not "
                f"{prompt_format!r}; drop --prompt-format or fix it"
            )
    if data.scored is None:
        raise ValueError(
            "the data mixes a reasoning model's answers (scored after the end-of-reasoning "
            "marker) with whole outputs: one calibration cannot map both; fit them apart"
        )
    if len(data.scores) == 0:
        raise ValueError(
            f"no labelled rows with a finite {measure!r} in {', '.join(map(str, paths))}"
        )
    cal = Calibrator(**params).fit(data.scores, data.labels)
    cal.meta = {
        "measure": measure,
        "model": model or data.model,
        "prompt_fingerprint": data.prompt_fingerprint,
        "prompt_format": prompt_format or data.prompt_format,
        "prompt_description": data.prompt_description,
        # which tokens its G-NLL covers: "answer" (after a reasoning model's marker) or "output"
        "scored": data.scored,
        "data": {
            "n": int(len(data.scores)),
            "n_correct": int(data.labels.sum()),
            "dropped": data.dropped,
            "sources": data.sources,
        },
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    return cal, data
