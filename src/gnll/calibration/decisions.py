"""Calibrated decisions with a stated guarantee: a threshold on the chosen option's probability.

``gnll calibrate --decisions`` fits, per question type (predicate, choice, score), on labelled
``gnll decide`` output rows:

- a :class:`~gnll.calibration.fitting.Calibrator` from the decision's uncertainty
  ``-log p`` (``p``: the chosen option's exact probability among the options) to P(correct);
- a Learn-then-Test threshold (:func:`~gnll.calibration.thresholds.accuracy_threshold`) on the same
  score, so that answering only when ``p >= t`` gives, on new questions like the calibration
  set, accuracy at least ``1 - alpha`` among the answered ones, with probability at least
  ``1 - delta`` over the draw of the calibration set.

The score is a fixed function of the model's probability (nothing fitted goes into it), so the
threshold's guarantee is exactly the one Learn then Test states; the calibrated P(correct) is
reported beside it. ``gnll serve --calibration FILE`` applies the file to ``/v1/decisions``: every
answer says what its threshold guarantees, and an answer below the threshold is refused.

Labelled rows are ``gnll decide`` output rows with a ``labels`` list beside ``questions`` (one gold
value per question, ``null`` for none): a predicate's ``true``/``false``, a choice's value, a score
level's index or label.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from gnll._util import atomic_write
from gnll.calibration.fitting import Calibrator

__all__ = [
    "FORMAT",
    "DecisionCalibration",
    "Verdict",
    "decision_score",
    "is_decisions_calibration",
    "labelled_decisions",
]

FORMAT = "gnll-decisions-calibration/1"
TYPES = ("predicate", "choice", "score")


def decision_score(p_top: float) -> float:
    """The uncertainty score of a decision: ``-log p`` of the chosen option (higher = less sure)."""
    return -math.log(p_top) if p_top > 0 else math.inf


def _is_correct(answer: dict[str, Any], label: Any) -> bool | None:
    """Whether a decision output row's answer matches its gold label (``None``: cannot tell)."""
    kind = answer.get("type")
    if kind == "predicate":
        if not isinstance(label, bool):
            return None
        return (answer["probability"] >= 0.5) == label
    if kind == "choice":
        return answer.get("choice") == label and type(answer.get("choice")) is type(label)
    if kind == "score":
        probs = answer.get("probabilities") or []
        best = max(probs, key=lambda o: o["probability"])
        if isinstance(label, bool):
            return None
        if isinstance(label, int):
            return best["value"] == label
        return best.get("label") == label
    return None


def _top(answer: dict[str, Any]) -> float | None:
    probs = answer.get("probabilities")
    if not probs:
        return None
    return max(float(o["probability"]) for o in probs)


def labelled_decisions(
    paths: list[str | Path],
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, Any]]:
    """Per question type, the ``(scores, correct)`` of every labelled, answered question in
    ``gnll decide`` output files; and facts about the data (model, counts, dropped)."""
    data: dict[str, tuple[list[float], list[bool]]] = {t: ([], []) for t in TYPES}
    models: set[str] = set()
    dropped = {"refused": 0, "unlabelled": 0, "unreadable_label": 0}
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            for n, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                try:
                    row = json.loads(raw)
                except json.JSONDecodeError:
                    raise ValueError(f"{path}:{n}: not a JSON line") from None
                answers, labels = row.get("answers"), row.get("labels")
                if not isinstance(answers, list):
                    raise ValueError(
                        f"{path}:{n}: no 'answers' list (not a `gnll decide` output row)"
                    )
                if row.get("model"):
                    models.add(str(row["model"]))
                if not isinstance(labels, list):
                    dropped["unlabelled"] += len(answers)
                    continue
                for answer, label in zip(answers, labels, strict=False):
                    if label is None:
                        dropped["unlabelled"] += 1
                        continue
                    if answer.get("type") == "refusal":  # no answer to be right or wrong
                        dropped["refused"] += 1
                        continue
                    p = _top(answer)
                    kind = answer.get("type")
                    ok = _is_correct(answer, label)
                    if ok is None or p is None:
                        dropped["unreadable_label"] += 1
                        continue
                    data[kind][0].append(decision_score(p))
                    data[kind][1].append(ok)
    out = {
        t: (np.asarray(s, dtype=np.float64), np.asarray(y, dtype=bool))
        for t, (s, y) in data.items()
        if s
    }
    return out, {"models": sorted(models), "dropped": dropped}


@dataclass
class Verdict:
    """What calibration says about one answer: answer or refuse, P(correct), the guarantee."""

    answer: bool
    p_correct: float
    guarantee: dict[str, Any]


class DecisionCalibration:
    """Per question type, a calibrator and a guaranteed threshold (see the module docstring)."""

    def __init__(self, alpha: float = 0.1, delta: float = 0.1, *, method: str = "auto") -> None:
        if not 0 < alpha < 1 or not 0 < delta < 1:
            raise ValueError(f"alpha and delta must be in (0, 1), got {alpha} and {delta}")
        self.alpha, self.delta, self.method = alpha, delta, method
        self.types: dict[str, Calibrator] = {}
        self.meta: dict[str, Any] = {}

    def fit(self, data: dict[str, tuple[np.ndarray, np.ndarray]]) -> DecisionCalibration:
        """Fit every question type that has labelled rows (``labelled_decisions``)."""
        if not data:
            raise ValueError("no labelled, answered decisions to calibrate on")
        skipped = {}
        for kind, (s, y) in data.items():
            cal = Calibrator(
                self.method, target_accuracy=1 - self.alpha, target_coverage=None, delta=self.delta
            )
            try:
                cal.fit(s, y)
            except ValueError as exc:  # e.g. every answer of this type right: nothing to learn
                skipped[kind] = str(exc)
                continue
            cal.meta = {"measure": "decision-nll", "question_type": kind}
            self.types[kind] = cal
        if not self.types:
            raise ValueError(
                "no question type could be calibrated: "
                + "; ".join(f"{k}: {why}" for k, why in skipped.items())
            )
        if skipped:
            self.meta["skipped_types"] = skipped
        return self

    def threshold(self, kind: str) -> float | None:
        """The probability ``t`` at or above which answers of this type are given (``None``: no
        calibration for the type; ``inf``: none are given)."""
        cal = self.types.get(kind)
        if cal is None:
            return None
        s = cal.thresholds_["accuracy"].threshold
        return math.inf if s == -math.inf else 0.0 if s == math.inf else math.exp(-s)

    def guarantee(self, kind: str) -> dict[str, Any] | None:
        """What the threshold of ``kind`` guarantees, in numbers and in one sentence."""
        cal = self.types.get(kind)
        if cal is None:
            return None
        th = cal.thresholds_["accuracy"]
        t = self.threshold(kind)
        assert t is not None
        n = cal.n_fit_
        if t == math.inf:
            statement = (
                f"no threshold reaches accuracy {1 - self.alpha:.2f} with probability "
                f"{1 - self.delta:.2f} on the {n} calibration {kind} questions: every answer is refused"
            )
        else:
            statement = (
                f"at p >= {t:.4f} answers are right at least {1 - self.alpha:.0%} of the time with "
                f"probability >= {1 - self.delta:.0%} on data like the calibration set "
                f"({n} {kind} questions, Learn then Test)"
            )
        return {
            "threshold": None if t == math.inf else t,
            "alpha": self.alpha,
            "delta": self.delta,
            "n_calibration": n,
            "calibration_accuracy": None if math.isnan(th.accuracy) else th.accuracy,
            "calibration_coverage": th.coverage,
            "method": th.method,
            "statement": statement,
        }

    def verdict(self, kind: str, p_top: float) -> Verdict | None:
        """Answer or refuse a ``kind`` answer whose chosen option has probability ``p_top``
        (``None``: this file has no calibration for the type)."""
        cal = self.types.get(kind)
        if cal is None:
            return None
        score = decision_score(p_top)
        p_correct = float(cal.predict_proba([score])[0])
        answer = not bool(cal.abstain([score], rule="accuracy")[0])
        guarantee = self.guarantee(kind)
        assert guarantee is not None
        return Verdict(answer, p_correct, guarantee)

    def apply(self, answer: Any) -> Any:
        """Calibrate one decision answer (a :class:`gnll.scoring.decisions.DecisionAnswer`) in place:
        its ``p_correct`` and ``guarantee``, and a refusal below the threshold that says why.
        Refusals, first-token answers and types this file has no calibration for pass unchanged
        (the calibration was fitted on exact probabilities)."""
        if answer.type == "refusal" or answer.method != "exact":
            return answer
        p = answer.top_probability
        verdict = self.verdict(answer.question_type, p) if p is not None else None
        if verdict is None:
            return answer
        answer.extra.update(p_correct=verdict.p_correct, guarantee=verdict.guarantee)
        if not verdict.answer:
            t = verdict.guarantee["threshold"]
            below = (
                "no threshold is guaranteed for this question type"
                if t is None
                else f"the chosen option's probability {p:.4f} is below the calibrated "
                f"threshold {t:.4f}"
            )
            answer.refuse(f"{below}: {verdict.guarantee['statement']}")
        return answer

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "alpha": self.alpha,
            "delta": self.delta,
            "types": {k: c.to_dict() for k, c in self.types.items()},
            "guarantees": {k: self.guarantee(k) for k in self.types},
            **self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DecisionCalibration:
        if d.get("format") != FORMAT:
            raise ValueError(
                f"not a gnll decisions calibration file (format {d.get('format')!r}, expected "
                f"{FORMAT!r})"
            )
        out = cls(float(d["alpha"]), float(d["delta"]))
        out.types = {k: Calibrator.from_dict(v) for k, v in d["types"].items()}
        known = {"format", "alpha", "delta", "types", "guarantees"}
        out.meta = {k: v for k, v in d.items() if k not in known}
        return out

    def save(self, path: str | Path) -> Path:
        from gnll._util import jsonable

        self.meta.setdefault("created", datetime.now(timezone.utc).isoformat(timespec="seconds"))
        text = json.dumps(jsonable(self.to_dict(), nan="none"), indent=2, ensure_ascii=False)
        return atomic_write(path, text + "\n")

    @classmethod
    def load(cls, path: str | Path) -> DecisionCalibration:
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read the decisions calibration file {path}: {exc}") from None
        out = cls.from_dict(d)
        out.meta.setdefault("path", str(path))
        return out


def is_decisions_calibration(path: str | Path) -> bool:
    """Whether ``path`` is a decisions calibration file (not a G-NLL one)."""
    try:
        with open(path, encoding="utf-8") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return f'"format": "{FORMAT}"' in head
