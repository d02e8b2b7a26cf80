"""A cascade of two models gated by the small model's score: its threshold, curve and guarantee.

The small model answers when its score (G-NLL) is at most a threshold ``t`` and escalates the
question to the large model otherwise. On question ``i`` the cascade is right when
``z_i(t) = [s_i <= t] * small_i + [s_i > t] * large_i`` is 1, so its accuracy on ``n`` labelled
questions is ``k(t) / n`` with ``k(t) = sum_i z_i(t)``, a binomial count for any fixed ``t``.

**The threshold with a guarantee** (:func:`cascade_threshold`) uses the same Learn-then-Test recipe as
:func:`gnll.calibration.thresholds.accuracy_threshold`: candidate thresholds are the small model's
score quantiles at escalation rates 1, 1 - 1/grid, ..., 0 (from the scores only); for each, the
hypothesis "cascade accuracy < target" is rejected when the exact binomial p-value
``P(Binomial(n, target) >= k(t))`` is small. The tests run in a fixed order and stop at the first
that cannot be rejected; because which model is the stronger one is not known before the labels are
seen, two such sequences run, each at level ``delta / 2``: from escalating all towards none (the
useful one when the upstream model is stronger) and from none towards all. Every threshold either
sequence passed is certified (family-wise error at most ``delta`` by the union bound), and the one
with the lowest escalation rate is chosen. So with probability at least ``1 - delta`` over the
labelled questions, a certified threshold keeps the cascade's accuracy on new questions from the
same distribution at or above ``target``. When none is certified the rule says the target is out of
reach (``achievable=False``) and escalates everything.

Both runs must hold the same questions (joined by task and id): one labelled run per model.

**The file** (``cascade.json``, :meth:`CascadeThreshold.save` / :meth:`CascadeThreshold.load`, format
:data:`FORMAT`) holds the threshold, its guarantee, both models, and the prompt format and templates
the small model's run was asked in: a G-NLL threshold fitted on answers to 5-shot instruction prompts
does not mean the same on answers to chat messages, so a server refuses to apply it to another
format (:meth:`CascadeThreshold.check`), as it refuses such a calibration.

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> s = rng.uniform(0, 1, 4000)
>>> small = rng.uniform(size=4000) < 1 - s; large = rng.uniform(size=4000) < 0.9
>>> t = cascade_threshold(s, small, large, target=0.75, delta=0.1)
>>> t.achievable, 0.2 < t.escalation_rate < 0.6, t.accuracy >= 0.75
(True, True, True)
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import binom

from gnll._util import atomic_write, jsonable, read_artifact, read_json
from gnll._util.runfiles import SAMPLES, RunDir, iter_samples, samples_path
from gnll._util.validation import check_scores_labels
from gnll.calibration.data import run_prompt_templates, templates_fingerprint
from gnll.calibration.fitting import CalibrationFormatError, CalibrationMismatchWarning
from gnll.calibration.thresholds import clopper_pearson_lower

__all__ = [
    "FORMAT",
    "CascadeData",
    "CascadeThreshold",
    "accuracy_at_rate",
    "cascade_curve",
    "cascade_threshold",
    "guarantee_violation_rate",
    "load_cascade",
    "random_accuracy_at_rate",
]


#: The version of ``cascade.json`` files (files of the first version, ``"kind": "gnll.cascade/1"``,
#: recorded no prompt format and are read as fitted on an unknown one).
FORMAT = "gnll-cascade/2"
_LEGACY_KIND = "gnll.cascade/1"


@dataclass
class CascadeData:
    """The same questions answered by both models: the small model's score and both verdicts.

    ``prompt_format``, ``prompt_fingerprint`` and ``prompt_description`` say how the small model
    was asked (a ``gnll eval`` run: its tasks' instruction prompts).
    """

    keys: list[tuple[str, str]]
    scores: np.ndarray
    small: np.ndarray
    large: np.ndarray
    small_model: str | None = None
    large_model: str | None = None
    dropped: int = 0
    measure: str = "g-nll"
    small_run: str | None = None
    large_run: str | None = None
    prompt_format: str | None = None
    prompt_fingerprint: str | None = None
    prompt_description: str | None = None

    def meta(self) -> dict[str, Any]:
        """What a threshold fitted on these questions records about them (``cascade.json``)."""
        return {
            "measure": self.measure,
            "small": {"run": self.small_run, "model": self.small_model},
            "large": {"run": self.large_run, "model": self.large_model},
            "n": len(self.keys),
            "accuracy_small": float(self.small.mean()),
            "accuracy_large": float(self.large.mean()),
            "prompt_format": self.prompt_format,
            "prompt_fingerprint": self.prompt_fingerprint,
            "prompt_description": self.prompt_description,
        }


@dataclass
class CascadeThreshold:
    """Escalate when the small model's score is above ``threshold`` (``-inf``: escalate all).

    ``escalation_rate``, ``accuracy`` and ``accuracy_lower`` (one-sided ``1 - delta``
    Clopper-Pearson) are those of the cascade on the labelled questions; ``achievable`` is False when
    not even escalating every question was shown to reach ``target``. ``meta`` says what it was
    fitted on (:meth:`CascadeData.meta`: the measure, both models, the prompt format and templates)
    and is written with it (:meth:`save`).

    Examples
    --------
    >>> t = CascadeThreshold(0.6, 0.1, 4.5, 0.3, 0.62, 0.6, True, "LTT",
    ...                      meta={"measure": "g-nll", "prompt_format": "instruction"})
    >>> t.applies("instruction"), t.applies("chat"), t.applies(None)
    (True, False, True)
    """

    target: float
    delta: float
    threshold: float
    escalation_rate: float
    accuracy: float
    accuracy_lower: float
    achievable: bool
    method: str
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The fitted rule and its guarantee (``cascade.json``'s ``threshold``)."""
        d = {
            "target": self.target,
            "delta": self.delta,
            "threshold": self.threshold if math.isfinite(self.threshold) else None,
            "escalation_rate": self.escalation_rate,
            "accuracy": self.accuracy,
            "accuracy_lower": self.accuracy_lower,
            "achievable": self.achievable,
            "method": self.method,
        }
        d["escalates_all"] = self.threshold == -math.inf
        return d

    @property
    def measure(self) -> str:
        return str(self.meta.get("measure", "g-nll"))

    @property
    def prompt_format(self) -> str | None:
        """The format of the prompts the small model answered (``None``: unknown)."""
        value = self.meta.get("prompt_format")
        return None if value is None else str(value)

    def applies(self, prompt_format: str | None) -> bool:
        """Whether the threshold may gate answers to ``prompt_format`` prompts (yes when either
        format is unknown), as :func:`gnll.calibration.calibration_applies` says for calibrations."""
        return (
            self.prompt_format is None
            or prompt_format is None
            or self.prompt_format == prompt_format
        )

    def check(
        self,
        *,
        prompt_format: str | None = None,
        prompt_fingerprint: str | None = None,
        model: str | None = None,
    ) -> list[str]:
        """Refuse (:class:`~gnll.calibration.CalibrationFormatError`) answers to another prompt
        format; warn (:class:`~gnll.calibration.CalibrationMismatchWarning`) on another small model
        or prompt template. Returns the warnings' messages."""
        where = self.meta.get("path", "the cascade threshold")
        if not self.applies(prompt_format):
            raise CalibrationFormatError(
                f"{where} was fitted on answers to {self.prompt_format!r} prompts "
                f"({self.meta.get('prompt_description') or 'the small model run'}) and cannot "
                f"gate answers to {prompt_format!r} prompts: the same G-NLL means another chance "
                f"of a right answer there; fit it on {prompt_format!r} answers, or apply it "
                "anyway knowingly"
            )
        problems = []
        fitted_model = (self.meta.get("small") or {}).get("model")
        if model and fitted_model and model != fitted_model:
            problems.append(
                f"{where} was fitted on small model {fitted_model!r}, used with {model!r}"
            )
        fitted_fp = self.meta.get("prompt_fingerprint")
        if prompt_fingerprint and fitted_fp and prompt_fingerprint != fitted_fp:
            problems.append(
                f"{where} was fitted on other prompts "
                f"({self.meta.get('prompt_description') or fitted_fp})"
            )
        for msg in problems:
            warnings.warn(
                msg + ": its guarantee may not hold", CalibrationMismatchWarning, stacklevel=2
            )
        return problems

    def to_file(self) -> dict[str, Any]:
        """The ``cascade.json`` document."""
        meta = {k: v for k, v in self.meta.items() if k != "path"}
        return {"format": FORMAT, **meta, "threshold": self.to_dict()}

    def save(self, path: str | Path) -> Path:
        """Write ``cascade.json`` (JSON; written to a temporary file first, then moved)."""
        return atomic_write(
            path,
            json.dumps(jsonable(self.to_file(), nan="none"), indent=2, ensure_ascii=False) + "\n",
        )

    @classmethod
    def from_file(cls, d: dict[str, Any]) -> CascadeThreshold:
        if d.get("format") != FORMAT and d.get("kind") != _LEGACY_KIND:
            raise ValueError(
                f"not a gnll cascade file (format {d.get('format') or d.get('kind')!r}, "
                f"expected {FORMAT!r})"
            )
        t = d["threshold"]
        value = t.get("threshold")
        meta = {k: v for k, v in d.items() if k not in ("format", "kind", "threshold")}
        return cls(
            target=float(t["target"]),
            delta=float(t["delta"]),
            threshold=-math.inf if value is None else float(value),
            escalation_rate=float(t["escalation_rate"]),
            accuracy=float(t["accuracy"]),
            accuracy_lower=float(t["accuracy_lower"]),
            achievable=bool(t["achievable"]),
            method=str(t.get("method", "")),
            meta=meta,
        )

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        prompt_format: str | None = None,
        prompt_fingerprint: str | None = None,
        model: str | None = None,
    ) -> CascadeThreshold:
        """Read ``cascade.json``; with ``prompt_format``, refuse a file fitted on another format;
        with ``prompt_fingerprint``/``model``, warn on another template or small model."""
        path = Path(path)
        fitted = read_artifact(path, "cascade file", cls.from_file)
        fitted.meta["path"] = str(path)
        fitted.check(
            prompt_format=prompt_format, prompt_fingerprint=prompt_fingerprint, model=model
        )
        return fitted


def _read(path: Path, measure: str, correctness: str | None) -> tuple[dict, str | None]:
    samples = samples_path(path)
    if not samples.exists():
        raise FileNotFoundError(f"{path}: no {SAMPLES} (is this a finished `gnll eval` run?)")
    rows: dict[tuple[str, str], tuple[float, float]] = {}
    for lineno, r in iter_samples(samples):
        where = f"{samples}:{lineno}"
        if measure not in r.get("measures", {}):
            raise ValueError(f"{where}: measure {measure!r} not in this run")
        corr = r.get("correctness", {})
        metric = correctness or next(iter(corr), None)
        if metric not in corr:
            raise ValueError(f"{where}: correctness {metric!r} missing")
        score, ok = r["measures"][measure], corr[metric].get("correct")
        if ok is None or score is None or not math.isfinite(float(score)):
            continue
        rows[(str(r.get("task")), str(r.get("id")))] = (float(score), float(bool(ok)))
    run_json = RunDir(samples.parent).run_json
    model = read_json(run_json)["config"].get("model") if run_json.exists() else None
    return rows, model


def load_cascade(
    small: str | Path, large: str | Path, *, measure: str = "g-nll", correctness: str | None = None
) -> CascadeData:
    """Join two ``gnll eval`` runs (directories or ``samples.jsonl``) over the same questions."""
    a, small_model = _read(Path(small), measure, correctness)
    b, large_model = _read(Path(large), measure, correctness)
    keys = [k for k in a if k in b]
    if not keys:
        raise ValueError(f"{small} and {large} share no question (joined by task and id)")
    small_dir = Path(small).parent if Path(small).is_file() else Path(small)
    fingerprint, description = templates_fingerprint(
        run_prompt_templates(small_dir, {task for task, _ in keys})
    )
    return CascadeData(
        keys,
        np.array([a[k][0] for k in keys]),
        np.array([a[k][1] for k in keys]),
        np.array([b[k][1] for k in keys]),
        small_model,
        large_model,
        dropped=len(a) + len(b) - 2 * len(keys),
        measure=measure,
        small_run=str(small),
        large_run=str(large),
        prompt_format="instruction",  # gnll eval asks its tasks' instruction prompts
        prompt_fingerprint=fingerprint,
        prompt_description=description,
    )


def _arrays(scores: Any, small: Any, large: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scores and both models' labels, checked as every (scores, labels) pair is."""
    names = ("scores", "small-model labels")
    s, a = check_scores_labels(scores, small, names=names, binary=False, nonempty=True)
    _, b = check_scores_labels(scores, large, names=(names[0], "large-model labels"), binary=False)
    return s, a, b


def _correct(s: np.ndarray, a: np.ndarray, b: np.ndarray, t: float) -> int:
    return int(np.where(s <= t, a, b).sum())


def cascade_threshold(
    scores: Any, small: Any, large: Any, *, target: float, delta: float = 0.1, grid: int = 20
) -> CascadeThreshold:
    """The threshold with the lowest escalation rate whose cascade accuracy is >= ``target`` with
    probability >= ``1 - delta`` (see the module docstring)."""
    s, a, b = _arrays(scores, small, large)
    if not (0 < target < 1 and 0 < delta < 1):
        raise ValueError(f"target and delta must be in (0, 1), got {target}, {delta}")
    n = len(s)
    order = np.sort(s)
    # escalate all, then fewer and fewer, down to none: fixed by the scores alone
    candidates = [-math.inf] + [
        float(order[max(1, math.ceil(j * n / grid)) - 1]) for j in range(1, grid + 1)
    ]
    passed: list[float] = []
    for sequence in (candidates, candidates[::-1]):  # each direction at level delta / 2
        for t in sequence:
            if binom.sf(_correct(s, a, b, t) - 1, n, target) > delta / 2:
                break
            passed.append(t)
    achievable = bool(passed)
    chosen = max(passed) if passed else -math.inf
    k = _correct(s, a, b, chosen)
    return CascadeThreshold(
        target,
        delta,
        chosen,
        float(np.mean(s > chosen)),
        k / n,
        clopper_pearson_lower(k, n, delta),
        achievable,
        f"Learn then Test: exact binomial tests in fixed sequence over {grid} escalation rates, "
        f"from escalating all to none and from none to all, each at level {delta}/2",
    )


def accuracy_at_rate(scores: Any, small: Any, large: Any, rate: float) -> float:
    """Cascade accuracy when the ``round(rate * n)`` highest-score questions are escalated (questions
    tied at the cut are escalated in proportion: the expected accuracy over tie-breaking)."""
    s, a, b = _arrays(scores, small, large)
    n = len(s)
    m = round(rate * n)
    if m <= 0:
        return float(a.mean())
    if m >= n:
        return float(b.mean())
    cut = np.sort(s)[::-1][m - 1]  # the m-th highest score
    above = s > cut
    tied = s == cut
    q = (m - int(above.sum())) / int(tied.sum())  # share of the tied questions escalated
    total = b[above].sum() + a[~above & ~tied].sum() + q * b[tied].sum() + (1 - q) * a[tied].sum()
    return float(total / n)


def random_accuracy_at_rate(small: Any, large: Any, rate: float) -> float:
    """Expected cascade accuracy when ``round(rate * n)`` questions are escalated at random."""
    a = np.asarray(small, dtype=np.float64)
    b = np.asarray(large, dtype=np.float64)
    m = round(rate * len(a))
    return float(((len(a) - m) * a.mean() + m * b.mean()) / len(a))


def cascade_curve(scores: Any, small: Any, large: Any) -> dict[str, np.ndarray]:
    """Escalation rate and cascade accuracy for every threshold (escalate all ... escalate none)."""
    s, a, b = _arrays(scores, small, large)
    cuts = np.concatenate([[-math.inf], np.unique(s)])
    rate = np.array([np.mean(s > t) for t in cuts])
    acc = np.array([_correct(s, a, b, t) / len(s) for t in cuts])
    return {"threshold": cuts, "escalation_rate": rate, "accuracy": acc}


def guarantee_violation_rate(
    scores: Any,
    small: Any,
    large: Any,
    *,
    target: float,
    delta: float,
    n_cal: int,
    draws: int = 1000,
    seed: int = 0,
) -> dict[str, float]:
    """How often a threshold fitted on ``n_cal`` questions is certified yet misses ``target`` on the
    population.

    The given questions are the population (their cascade accuracy at any threshold is known
    exactly); each draw fits :func:`cascade_threshold` on ``n_cal`` questions drawn from it with
    replacement and checks the population accuracy at the fitted threshold. The guarantee says the
    violation rate (certified and below target) is at most ``delta``.
    """
    s, a, b = _arrays(scores, small, large)
    rng = np.random.default_rng(seed)
    violations, certified, rates = 0, 0, []
    for _ in range(draws):
        idx = rng.integers(0, len(s), n_cal)
        t = cascade_threshold(s[idx], a[idx], b[idx], target=target, delta=delta)
        if not t.achievable:
            continue
        certified += 1
        violations += _correct(s, a, b, t.threshold) / len(s) < target
        rates.append(float(np.mean(s > t.threshold)))
    return {
        "violation_rate": violations / draws,
        "certified_rate": certified / draws,
        "mean_escalation_rate": float(np.mean(rates)) if rates else float("nan"),
        "draws": draws,
        "n_cal": n_cal,
    }
