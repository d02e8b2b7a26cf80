"""``Calibrator``: a monotone map from an uncertainty score (default G-NLL) to P(correct).

Two maps, both from scikit-learn: isotonic regression (non-increasing in the score: more uncertain
never means more likely correct) and Platt scaling (a logistic regression on the score, its slope
held at <= 0 for the same reason: a fit with a positive slope becomes the constant map). With
``method="auto"`` each is scored by stratified k-fold cross-validated log-loss and the better one is
refitted on all rows; the out-of-fold predictions of the chosen method give the held-out ECE, Brier
score, log-loss, AUROC and reliability diagram. (The choice itself was made on those folds, which
makes the held-out figures of the chosen method very slightly optimistic; both methods' figures are
kept in ``cv_`` so the choice can be checked.)

Isotonic predictions are kept inside ``[1/(2n), 1 - 1/(2n)]`` (``n`` rows fitted on): a step fitted
on finitely many rows never earns a probability of exactly 0 or 1, and log-loss stays finite.

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> s = rng.exponential(1.0, 3000)
>>> y = rng.uniform(size=3000) < 1 / (1 + np.exp(-(1.0 - 2.0 * s)))
>>> cal = Calibrator(method="platt").fit(s, y)
>>> p = cal.predict_proba([0.0, 0.5, 2.0])
>>> bool(abs(p[0] - 0.731) < 0.05 and p[0] > p[1] > p[2])
True
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import expit

from gnll._util import atomic_write, jsonable, read_artifact
from gnll._util.validation import check_scores_labels
from gnll.backends.prompting import PROMPT_FORMATS
from gnll.calibration.metrics import log_loss, probability_metrics
from gnll.calibration.thresholds import Threshold, accuracy_threshold, coverage_threshold

__all__ = [
    "FORMAT",
    "CalibrationFormatError",
    "CalibrationMismatchWarning",
    "Calibrator",
    "calibration_applies",
    "scored_mismatch",
]

FORMAT = "gnll-calibration/1"
METHODS = ("isotonic", "platt")
RULES = ("accuracy", "coverage")


class CalibrationMismatchWarning(UserWarning):
    """A calibration file is used with another model or prompt template than it was fitted on."""


class CalibrationFormatError(ValueError):
    """A calibration is applied to answers produced under another prompt format than it was
    fitted on (:mod:`gnll.backends.prompting`): the same G-NLL means another P(correct) there."""


#: What files written before the prompt format was recorded said instead (``prompt_format`` held
#: a description then); both describe gnll's instruction prompts.
_LEGACY_DESCRIPTIONS = {"gnll ask": "instruction", "prompts of gnll eval": "instruction"}


def _read_prompt_format(meta: dict[str, Any]) -> None:
    """Turn an older file's ``prompt_format`` description into a format name (in place)."""
    value = meta.get("prompt_format")
    if value is None or value in PROMPT_FORMATS:
        return
    meta.setdefault("prompt_description", value)
    meta["prompt_format"] = next(
        (fmt for head, fmt in _LEGACY_DESCRIPTIONS.items() if str(value).startswith(head)), None
    )


def calibration_applies(
    calibrator: Calibrator, prompt_format: str | None, scored: str | None = None
) -> bool:
    """Whether ``calibrator`` may give P(correct) for answers to ``prompt_format`` prompts (yes
    when either format is unknown) whose G-NLL covers ``scored`` tokens: ``"answer"`` (a
    reasoning model's answer after its end-of-reasoning marker) or ``"output"`` (no reasoning;
    what a file that does not say was fitted on). ``scored=None``: not checked."""
    fitted = calibrator.meta.get("prompt_format")
    fitted_scored = calibrator.meta.get("scored") or "output"
    if scored is not None and scored != fitted_scored:
        return False
    return fitted is None or prompt_format is None or fitted == prompt_format


def scored_mismatch(calibrator: Calibrator, scored: str | None) -> str | None:
    """Why ``calibrator`` cannot map G-NLLs that cover ``scored`` tokens (``None``: it can)."""
    fitted = calibrator.meta.get("scored") or "output"
    if scored is None or scored == fitted:
        return None
    what = {
        "answer": "a reasoning model's answers (after the end-of-reasoning marker)",
        "output": "whole outputs (no reasoning split)",
    }
    return (
        f"{calibrator.meta.get('path', 'the calibration')} was fitted on the G-NLL of "
        f"{what.get(fitted, fitted)}, not of {what.get(scored, scored)}: its P(correct) would "
        "not apply; fit a calibration on answers split the same way"
    )


def _fit_map(method: str, s: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Fit one map on (s, y); return it as plain numbers (what ``calibration.json`` stores)."""
    if method == "isotonic":
        from sklearn.isotonic import IsotonicRegression

        eps = 1.0 / (2 * len(s))
        iso = IsotonicRegression(increasing=False, y_min=eps, y_max=1 - eps, out_of_bounds="clip")
        iso.fit(s, y)
        return {
            "kind": "isotonic",
            "x": iso.X_thresholds_.tolist(),
            "y": iso.y_thresholds_.tolist(),
        }
    if method == "platt":
        from sklearn.linear_model import LogisticRegression

        # Weak regularisation only: C is large so the fit is (nearly) plain maximum likelihood.
        lr = LogisticRegression(C=1e6)
        lr.fit(s.reshape(-1, 1), y.astype(int))
        coef, intercept = float(lr.coef_[0, 0]), float(lr.intercept_[0])
        if coef > 0:
            # The data favour "more uncertain, more often right". Within the monotone family the
            # maximum-likelihood map is then the constant one (the log-likelihood is concave in the
            # slope), so the score carries no usable signal here and the map says so.
            coef, intercept = 0.0, float(np.log(y.mean() / (1 - y.mean())))
        return {"kind": "platt", "coef": coef, "intercept": intercept}
    raise ValueError(f"method must be one of {METHODS} or 'auto', got {method!r}")


def _apply_map(m: dict[str, Any], s: np.ndarray) -> np.ndarray:
    if m["kind"] == "isotonic":
        # IsotonicRegression.predict with out_of_bounds="clip" is exactly this interpolation.
        return np.interp(s, np.asarray(m["x"]), np.asarray(m["y"]))
    if m["kind"] == "platt":
        return expit(m["coef"] * s + m["intercept"])
    raise ValueError(f"unknown map kind {m['kind']!r} in calibration file")


class Calibrator:
    """Map an uncertainty score to the probability that the answer is correct.

    Parameters
    ----------
    method:
        ``"auto"`` (the lower cross-validated log-loss of the two), ``"isotonic"`` or ``"platt"``.
    cv:
        Folds of the stratified cross-validation (held-out metrics and the choice of method).
    target_accuracy, target_coverage, delta:
        Abstention thresholds to fit (``None`` skips one): accuracy among answered >= target, or
        fraction answered >= target, each with probability >= ``1 - delta``
        (:mod:`gnll.calibration.thresholds`).
    bins:
        Bins of the ECE and of the reliability diagram.
    random_state:
        Seed of the fold assignment.

    Attributes (after :meth:`fit`)
    ------------------------------
    method_, map_:
        The chosen method and its fitted map (plain numbers).
    cv_:
        Per method: held-out (out-of-fold) metrics.
    heldout_:
        Out-of-fold predictions of the chosen method: ``{"p": ..., "y": ...}`` (for the diagram).
    thresholds_:
        ``{"accuracy": Threshold, "coverage": Threshold}`` (those asked for).
    default_rule:
        The threshold :meth:`abstain` (and ``gnll ask``/``serve``) applies when none is named:
        ``default_rule`` as given; otherwise ``"accuracy"`` when that rule answers some questions
        of the labelled data, else ``"coverage"`` (an accuracy target the model cannot reach would
        refuse every answer). Written to the file with its reason.
    meta:
        Free-form facts recorded in the file: measure, model, prompt fingerprint, data.
    """

    def __init__(
        self,
        method: str = "auto",
        *,
        cv: int = 5,
        target_accuracy: float | None = 0.8,
        target_coverage: float | None = 0.8,
        delta: float = 0.1,
        bins: int = 10,
        random_state: int = 0,
        default_rule: str | None = None,
    ) -> None:
        if default_rule not in (None, *RULES):
            raise ValueError(f"default_rule must be one of {RULES}, got {default_rule!r}")
        self.default_rule_given = default_rule
        self.method = method
        self.cv = cv
        self.target_accuracy = target_accuracy
        self.target_coverage = target_coverage
        self.delta = delta
        self.bins = bins
        self.random_state = random_state
        self.meta: dict[str, Any] = {}

    # ------------------------------------------------------------------ fitting
    def fit(self, scores: Any, labels: Any) -> Calibrator:
        """Fit on uncertainty ``scores`` and 0/1 (or bool) ``labels`` (1 = correct)."""
        from sklearn.model_selection import StratifiedKFold

        s, y = check_scores_labels(
            np.asarray(scores, dtype=np.float64).ravel(),
            np.asarray(labels, dtype=np.float64).ravel(),
        )
        if self.method not in (*METHODS, "auto"):
            raise ValueError(f"method must be one of {METHODS} or 'auto', got {self.method!r}")
        n_pos = int(y.sum())
        n_min = min(n_pos, len(y) - n_pos)
        if n_min < 2:
            raise ValueError(
                f"need at least 2 correct and 2 incorrect rows to calibrate, got {n_pos} correct "
                f"of {len(y)}; label more data (or use a task the model sometimes gets right)"
            )
        folds = max(2, min(self.cv, n_min))
        skf = StratifiedKFold(n_splits=folds, shuffle=True, random_state=self.random_state)
        candidates = METHODS if self.method == "auto" else (self.method,)
        oof = {m: np.empty_like(s) for m in candidates}
        for train, test in skf.split(s.reshape(-1, 1), y.astype(int)):
            for m in candidates:
                oof[m][test] = _apply_map(_fit_map(m, s[train], y[train]), s[test])
        self.cv_ = {
            m: {**probability_metrics(oof[m], y, bins=self.bins), "folds": folds}
            for m in candidates
        }
        self.method_ = min(candidates, key=lambda m: log_loss(oof[m], y))
        self.map_ = _fit_map(self.method_, s, y)
        self.heldout_ = {"p": oof[self.method_], "y": y}
        self.thresholds_: dict[str, Threshold] = {}
        if self.target_accuracy is not None:
            self.thresholds_["accuracy"] = accuracy_threshold(
                s, y, target=self.target_accuracy, delta=self.delta
            )
        if self.target_coverage is not None:
            self.thresholds_["coverage"] = coverage_threshold(
                s, y, target=self.target_coverage, delta=self.delta
            )
        self.n_fit_ = len(s)
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "map_"):
            raise RuntimeError("this Calibrator is not fitted yet: call fit() or Calibrator.load()")

    # ------------------------------------------------------------------ using it
    def predict_proba(self, scores: Any) -> np.ndarray:
        """P(correct) for each score, a 1-D array (not sklearn's two columns: one number per answer).

        NaN scores give NaN probabilities (they are never silently mapped to a number).
        """
        self._check_fitted()
        s = np.atleast_1d(np.asarray(scores, dtype=np.float64))
        out = np.full(s.shape, np.nan)
        ok = np.isfinite(s)
        out[ok] = _apply_map(self.map_, s[ok])
        return out

    @property
    def default_rule(self) -> str | None:
        """The rule applied when none is named (see the class docstring); ``None``: none fitted."""
        self._check_fitted()
        return _default_rule(self.thresholds_, self.default_rule_given)[0]

    def abstain(self, scores: Any, rule: str | None = None) -> np.ndarray:
        """True where the abstention rule (by default :attr:`default_rule`) abstains."""
        self._check_fitted()
        if not self.thresholds_:
            raise ValueError(
                "no abstention threshold was fitted (target_accuracy and target_coverage were None)"
            )
        rule = rule or self.default_rule
        if rule not in self.thresholds_:
            raise ValueError(
                f"no {rule!r} threshold was fitted (there is: {', '.join(self.thresholds_)})"
            )
        s = np.atleast_1d(np.asarray(scores, dtype=np.float64))
        # A NaN score is not evidence of being right: abstain.
        return ~(np.isfinite(s) & self.thresholds_[rule].answers(s))

    @property
    def heldout_metrics(self) -> dict[str, Any]:
        self._check_fitted()
        return self.cv_.get(self.method_, {})

    def check(
        self,
        *,
        model: str | None = None,
        prompt_fingerprint: str | None = None,
        prompt_format: str | None = None,
        prompt_description: str | None = None,
        scored: str | None = None,
    ) -> list[str]:
        """Warn (:class:`CalibrationMismatchWarning`) when used on another model or prompt template;
        refuse (:class:`CalibrationFormatError`) answers to another prompt format, or split
        otherwise (``scored``: a reasoning model's answer, or whole outputs).

        ``prompt_description`` says in words which prompts the answers come from (the warning
        names both templates so, never by their fingerprints).

        Returns the mismatch messages (empty when everything matches or is unknown).
        """
        why = scored_mismatch(self, scored)
        if why is not None:
            raise CalibrationFormatError(why)
        if not calibration_applies(self, prompt_format):
            where = self.meta.get("path", "the calibration")
            raise CalibrationFormatError(
                f"{where} was fitted on answers to {self.meta['prompt_format']!r} prompts and "
                f"cannot give P(correct) for answers to {prompt_format!r} prompts; use the "
                f"{self.meta['prompt_format']!r} format or fit a calibration on "
                f"{prompt_format!r} answers (gnll calibrate --prompt-format {prompt_format})"
            )
        problems = []
        fitted_model = self.meta.get("model")
        if model and fitted_model and model != fitted_model:
            problems.append(
                f"calibration was fitted on model {fitted_model!r}, used with {model!r}"
            )
        fitted_fp = self.meta.get("prompt_fingerprint")
        if prompt_fingerprint and fitted_fp and prompt_fingerprint != fitted_fp:
            fitted = self.meta.get("prompt_description") or (
                f"other {self.meta['prompt_format']!r} prompts"
                if self.meta.get("prompt_format")
                else "other prompts"
            )
            problems.append(
                f"the calibration was fitted on answers to {fitted}, but is used on answers to "
                f"{prompt_description or 'other prompts'} (another prompt template gives other "
                "G-NLL values)"
            )
        for msg in problems:
            warnings.warn(msg + ": P(correct) may be off", CalibrationMismatchWarning, stacklevel=2)
        return problems

    # ------------------------------------------------------------------ the file
    def to_dict(self) -> dict[str, Any]:
        self._check_fitted()
        return {
            "format": FORMAT,
            "measure": self.meta.get("measure", "g-nll"),
            "method": self.method_,
            "method_choice": (
                "lower cross-validated log-loss" if self.method == "auto" else "given by the user"
            ),
            "map": self.map_,
            "heldout": self.heldout_metrics,
            "cv": self.cv_,
            "thresholds": {k: t.to_dict() for k, t in self.thresholds_.items()},
            "default_rule": dict(
                zip(
                    ("rule", "why"),
                    _default_rule(self.thresholds_, self.default_rule_given),
                    strict=True,
                )
            ),
            "params": {
                "cv": self.cv,
                "delta": self.delta,
                "bins": self.bins,
                "random_state": self.random_state,
            },
            "n_fit": self.n_fit_,
            **{k: v for k, v in self.meta.items() if k != "measure"},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibrator:
        if d.get("format") != FORMAT:
            raise ValueError(
                f"not a gnll calibration file (format {d.get('format')!r}, expected {FORMAT!r})"
            )
        params = d.get("params", {})
        cal = cls(
            method=d["method"],
            cv=params.get("cv", 5),
            delta=params.get("delta", 0.1),
            bins=params.get("bins", 10),
            random_state=params.get("random_state", 0),
        )
        cal.method_ = d["method"]
        cal.map_ = d["map"]
        _apply_map(cal.map_, np.zeros(1))  # fails now, not at first use, on an unknown map kind
        cal.cv_ = d.get("cv", {})
        cal.thresholds_ = {k: Threshold.from_dict(t) for k, t in d.get("thresholds", {}).items()}
        # a file states its default rule; older files had none (then the same choice is made)
        given = (d.get("default_rule") or {}).get("rule")
        if given is not None and given not in cal.thresholds_:
            raise ValueError(f"default_rule {given!r} has no fitted threshold")
        cal.default_rule_given = given
        cal.n_fit_ = d.get("n_fit")
        known = {
            "format",
            "method",
            "method_choice",
            "map",
            "heldout",
            "cv",
            "thresholds",
            "params",
            "n_fit",
            "default_rule",
        }
        cal.meta = {k: v for k, v in d.items() if k not in known}
        _read_prompt_format(cal.meta)
        return cal

    def save(self, path: str | Path) -> Path:
        """Write the calibration file (JSON; no pickles, so it is safe to share and read)."""
        return atomic_write(
            path,
            json.dumps(jsonable(self.to_dict(), nan="none"), indent=2, ensure_ascii=False) + "\n",
        )

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        model: str | None = None,
        prompt_fingerprint: str | None = None,
        prompt_format: str | None = None,
        prompt_description: str | None = None,
    ) -> Calibrator:
        """Read a calibration file; with ``model``/``prompt_fingerprint``, warn on a mismatch
        (``prompt_description``: the prompts in use, in words); with ``prompt_format``, refuse a
        file fitted on another format."""
        path = Path(path)
        cal = read_artifact(path, "calibration file", cls.from_dict)
        cal.meta.setdefault("path", str(path))
        cal.check(
            model=model,
            prompt_fingerprint=prompt_fingerprint,
            prompt_format=prompt_format,
            prompt_description=prompt_description,
        )
        return cal

    def __repr__(self) -> str:
        if hasattr(self, "method_"):
            return f"Calibrator(method={self.method_!r}, n_fit={self.n_fit_})"
        return f"Calibrator(method={self.method!r}, unfitted)"


def _default_rule(thresholds: dict[str, Threshold], given: str | None) -> tuple[str | None, str]:
    """The rule applied when none is named, and why (written to the calibration file)."""
    if given is not None:
        return given, "chosen when the calibration was fitted"
    acc, cov = thresholds.get("accuracy"), thresholds.get("coverage")
    if acc is not None and (cov is None or acc.threshold != -math.inf):
        return "accuracy", (
            f"accuracy among answered >= {acc.target:g} (probability {1 - acc.delta:g}) is "
            "reachable on the calibration data"
            if acc.threshold != -math.inf
            else "the only rule fitted"
        )
    if cov is not None:
        why = "the only rule fitted"
        if acc is not None:
            if cov.threshold == math.inf:
                does = "answers every question"
            else:
                does = f"answers when the score is <= {cov.threshold:.4g}"
            why = (
                f"accuracy among answered >= {acc.target:g} is out of reach on the calibration "
                f"data (that rule refuses every answer); the coverage rule instead answers at "
                f"least {cov.target:g} of the questions (probability {1 - cov.delta:g}): on this "
                f"data it {does} ({cov.coverage:.3f} answered)"
            )
        return "coverage", why
    return None, "no threshold fitted"
