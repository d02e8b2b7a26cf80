"""The ``uncertainty`` object attached to every answer, and the abstention policy that reads it.

G-NLL is defined for the *greedy* answer: ``-sum_t log p(y_t | x, y_<t)`` along the greedy path. For
a sampled answer the same sum is the NLL of that sample, a different quantity (it grows with the
temperature's randomness, not only with the model's uncertainty), so it is reported as ``nll`` with
``decoding: "sampled"`` and ``g_nll: null``, and no abstention decision is taken on it.

Examples
--------
>>> policy = AbstentionPolicy(threshold=2.0)
>>> u = uncertainty_record([-0.1, -0.2], decoding="greedy", policy=policy)
>>> round(u.g_nll, 3), u.num_tokens, u.abstain
(0.3, 2, False)
>>> uncertainty_record([-0.1, -3.0], decoding="sampled", policy=policy).g_nll is None
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from gnll._util.validation import ParameterError
from gnll.backends.reasoning import ReasoningSplit
from gnll.measures import g_nll as _g_nll
from gnll.measures import ln_g_nll as _ln_g_nll
from gnll.measures.early import EarlyDecision, EarlyDecisionError, check_nonincreasing
from gnll.measures.logprobs import LogprobError, check_logprobs
from gnll.uncertainty import Uncertainty

if TYPE_CHECKING:
    from gnll.calibration import Calibrator
    from gnll.calibration.cascade import CascadeThreshold
    from gnll.serving.responses import Answer

Mode = Literal["annotate", "flag", "refuse", "escalate"]
MODES: tuple[str, ...] = ("annotate", "flag", "refuse", "escalate")
DEFAULT_REFUSAL = "I am not confident enough to answer this."


@dataclass
class AbstentionPolicy:
    """What to do with answers that are likely wrong, decided on their G-NLL.

    Parameters
    ----------
    mode:
        ``"annotate"`` (add ``p_correct``/``abstain``), ``"flag"`` (the same; clients read
        ``uncertainty.abstain`` or the ``X-Uncertainty-Abstain`` header: ``finish_reason`` keeps
        OpenAI's values), ``"refuse"`` (replace the answer text by ``refusal``; the refused text,
        its tokens and log-probs are not sent anywhere) or ``"escalate"`` (ask a larger upstream
        model instead: :mod:`gnll.serving.cascade`).
    calibrator:
        A fitted :class:`gnll.calibration.Calibrator` (``gnll calibrate``): gives ``p_correct``, and
        by default abstains with its fitted threshold (``rule``: ``"accuracy"`` -- accuracy among
        answered >= target with probability 1 - delta -- or ``"coverage"``).
    min_p_correct:
        With a calibrator: abstain when ``p_correct`` is below this instead of the fitted rule.
    threshold:
        Without a calibrator: abstain when G-NLL is above this.
    source:
        Where the decision comes from, shown to clients.
    rule:
        With a calibrator: which fitted threshold decides (default: the file's own).
    cascade:
        A :class:`gnll.calibration.cascade.CascadeThreshold` (``gnll calibrate --cascade``; see
        :meth:`from_cascade`): escalate when G-NLL is above its threshold. It gates only answers to
        the prompt format it was fitted on (others get no decision), unless ``any_prompt_format``.
    any_prompt_format:
        Apply ``cascade`` to answers of every prompt format (its guarantee then does not carry over).

    Errors name the parameter (:class:`gnll._util.validation.ParameterError`).

    Examples
    --------
    >>> AbstentionPolicy(threshold=1.0).decide(1.5)
    (None, True)
    >>> AbstentionPolicy().decide(1.5)
    (None, None)
    """

    mode: Mode = "annotate"
    calibrator: Calibrator | None = None
    min_p_correct: float | None = None
    threshold: float | None = None
    refusal: str = DEFAULT_REFUSAL
    source: str = "none"
    rule: str | None = None
    cascade: CascadeThreshold | None = None
    any_prompt_format: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ParameterError("mode", f"must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.cascade is not None:
            self._take_cascade(self.cascade)
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise ParameterError("threshold", f"must be a finite G-NLL value, got {self.threshold}")
        if self.min_p_correct is not None and not 0.0 <= self.min_p_correct <= 1.0:
            raise ParameterError("min_p_correct", f"must be in [0, 1], got {self.min_p_correct}")
        if self.calibrator is None:
            for name in ("min_p_correct", "rule"):
                if getattr(self, name) is not None:
                    raise ParameterError(
                        name,
                        "needs calibrator (without one, threshold on G-NLL decides)",
                        others=("calibrator", "threshold"),
                    )
        else:
            if self.threshold is not None:
                raise ParameterError(
                    "threshold",
                    "cannot be given with calibrator (give one of them)",
                    others=("calibrator",),
                )
            fitted = self.calibrator.thresholds_ or {}
            if self.rule is None and self.min_p_correct is None and fitted:
                self.rule = self.calibrator.default_rule or next(iter(fitted))
            if self.rule is not None and self.rule not in fitted:
                raise ParameterError(
                    "rule",
                    f"{self.rule!r}: the calibration file has no such threshold "
                    f"(it has: {', '.join(fitted) or 'none'}); give min_p_correct instead",
                    others=("min_p_correct",),
                )
        if self.source == "none" and self.threshold is not None:
            verb = "escalate" if self.mode == "escalate" else "abstain"
            self.source = f"threshold: {verb} when G-NLL > {self.threshold:g}"

    @classmethod
    def from_calibration(
        cls,
        spec: str | Path,
        *,
        model: str | None = None,
        prompt_fingerprint: str | None = None,
        prompt_description: str | None = None,
        **kwargs: Any,
    ) -> AbstentionPolicy:
        """A policy whose ``p_correct`` comes from a ``gnll calibrate`` file, or ``"auto"``: the file
        shipped for an embedded ``model``. Warns (``CalibrationMismatchWarning``) when the file was
        fitted on another model, or on another prompt template than ``prompt_fingerprint`` (the
        template requests are asked in, described by ``prompt_description``)."""
        from gnll.calibration import load_calibration, shipped_calibration

        calibrator = load_calibration(
            spec,
            model=model,
            prompt_fingerprint=prompt_fingerprint,
            prompt_description=prompt_description,
        )
        measure = calibrator.meta.get("measure", "g-nll")
        if measure != "g-nll":
            raise ValueError(f"{spec} calibrates {measure!r}; gnll serve needs a G-NLL calibration")
        policy = cls(calibrator=calibrator, **kwargs)
        if policy.source == "none":
            shipped = shipped_calibration(model or "") if str(spec) == "auto" else None
            name = f"{shipped.name} (shipped)" if shipped is not None else Path(spec).name
            policy.source = name + _rule_text(policy)
        return policy

    @classmethod
    def from_cascade(
        cls,
        path: str | Path,
        *,
        mode: Mode = "escalate",
        model: str | None = None,
        any_prompt_format: bool = False,
        refusal: str = DEFAULT_REFUSAL,
    ) -> AbstentionPolicy:
        """An escalation policy whose threshold is a ``gnll calibrate --cascade`` file's
        (:class:`gnll.calibration.cascade.CascadeThreshold`). Warns when it was fitted on another
        small model than ``model``; the server refuses it for chat requests of another prompt
        format than it was fitted on unless ``any_prompt_format``."""
        from gnll.calibration.cascade import CascadeThreshold

        fitted = CascadeThreshold.load(path, model=model)
        return cls(mode=mode, cascade=fitted, any_prompt_format=any_prompt_format, refusal=refusal)

    def _take_cascade(self, fitted: CascadeThreshold) -> None:
        if self.mode != "escalate":
            raise ParameterError(
                "cascade",
                f"is a threshold for mode 'escalate', not {self.mode!r}",
                others=("mode",),
            )
        if self.calibrator is not None or self.threshold is not None:
            raise ParameterError(
                "cascade",
                "cannot be given with calibrator or threshold (it is the threshold)",
                others=("calibrator", "threshold"),
            )
        where = fitted.meta.get("path", "the cascade file")
        if fitted.measure != "g-nll":
            raise ParameterError(
                "cascade", f"{where} gates on {fitted.measure!r}; gnll serve escalates on G-NLL"
            )
        if not math.isfinite(fitted.threshold):
            raise ParameterError(
                "cascade",
                f"{where}: its target accuracy {fitted.target:g} is out of reach on the calibration "
                "questions, so it escalates every question (serve the larger model alone, or fit "
                "a lower target)",
            )
        self.threshold = fitted.threshold
        if self.source == "none":
            self.source = (
                f"{Path(where).name}: escalate when G-NLL > {fitted.threshold:.4g} (cascade accuracy "
                f">= {fitted.target:g} with probability {1 - fitted.delta:g}, escalation rate "
                f"{fitted.escalation_rate:.3g} on its {fitted.meta.get('prompt_format') or 'unknown'} "
                "prompts)"
            )

    def refuses_everything(self) -> str | None:
        """Why this policy would abstain on every answer (G-NLL >= 0), or ``None`` if it would not."""
        if self.threshold is not None and self.threshold < 0:
            return f"threshold {self.threshold:g} is below 0, and every G-NLL is >= 0"
        if self.calibrator is None:
            return None
        if self.min_p_correct is not None:
            best = _best_p_correct(self.calibrator)
            if best < self.min_p_correct:
                return (
                    f"the calibration never gives p_correct above {best:.3g}, below "
                    f"min_p_correct {self.min_p_correct:g}"
                )
            return None
        if self.rule is not None:
            t = self.calibrator.thresholds_[self.rule]
            if t.threshold < 0:  # -inf: the rule's target is out of reach
                return f"the calibration's {self.rule!r} rule{_rule_text(self)}"
        return None

    @property
    def active(self) -> bool:
        return self.calibrator is not None or self.threshold is not None

    def decide(
        self, g_nll: float, prompt_format: str | None = None, scored: str | None = None
    ) -> tuple[float | None, bool | None]:
        """``(p_correct, abstain)`` for a greedy answer's G-NLL (``None`` when not configured, or
        when the calibration was fitted on another prompt format than the answer's, or on answers
        split otherwise: ``scored`` is ``"answer"`` for a reasoning model's, ``"output"`` else)."""
        if self.calibrator is not None:
            from gnll.calibration import calibration_applies

            if not calibration_applies(self.calibrator, prompt_format, scored):
                return None, None
            p = float(self.calibrator.predict_proba([g_nll])[0])
            if self.min_p_correct is not None:
                return p, bool(p < self.min_p_correct)
            if self.rule is not None:
                return p, bool(self.calibrator.abstain([g_nll], self.rule)[0])
            return p, None
        if self.threshold is not None:
            cascade = self.cascade
            if (
                cascade is not None
                and not self.any_prompt_format
                and not cascade.applies(prompt_format)
            ):
                return None, None  # fitted on answers to another prompt format
            return None, bool(g_nll > self.threshold)
        return None, None

    def early_decision(
        self, *, where: str = "answer", prompt_format: str | None = None
    ) -> EarlyDecision:
        """A running decision for one greedy answer (:mod:`gnll.measures.early`): it says
        ``decided`` at the first released answer token after which this policy abstains on the
        answer whatever comes next, with the policy's own :meth:`decide` as the test.

        Raises
        ------
        EarlyDecisionError
            For a policy that does not refuse or escalate, has no threshold, or whose calibrated
            map is not non-increasing in G-NLL (then no decision is exact before the end).
        """
        if self.mode not in ("refuse", "escalate"):
            raise EarlyDecisionError(
                f"early decisions stop an answer that is refused or escalated; mode {self.mode} "
                "sends every answer, so it is decided at the end (use mode refuse or escalate)",
                param="mode",
            )
        if not self.active:
            raise EarlyDecisionError(
                "early decisions need a rule to decide by: give threshold or calibrator",
                param="threshold",
                others=("calibrator",),
            )
        self.check_monotone()

        def abstains(g: float) -> bool:
            return bool(self.decide(g, prompt_format)[1])

        return EarlyDecision(abstains, action=self.mode, where=where)

    def check_monotone(self) -> None:
        """Refuse (:class:`EarlyDecisionError`) a policy whose abstention set in G-NLL is not closed
        upwards. ``G-NLL > threshold`` and a fitted rule (``G-NLL <= t`` answers) always are; a
        ``--min_p_correct`` target is when the calibrated map is non-increasing."""
        if self.calibrator is None or self.min_p_correct is None:
            return
        m = self.calibrator.map_
        what = f"the calibration map ({m.get('kind')})"
        if m.get("kind") == "isotonic":
            check_nonincreasing(m["x"], m["y"], what=what)
        elif m.get("kind") == "platt":
            if m["coef"] > 0:
                raise EarlyDecisionError(
                    f"{what} is not monotone the right way: p_correct rises with G-NLL "
                    f"(coef {m['coef']:g} > 0), so an answer it rejects part-way may be accepted at "
                    "its end; early decisions need a non-increasing map (gnll calibrate fits one)"
                )
        else:
            raise EarlyDecisionError(f"{what}: cannot tell whether it is monotone")

    def describe(self) -> dict[str, Any]:
        return {
            "policy": self.mode,
            "source": self.source,
            "calibrated": self.calibrator is not None,
            "threshold_g_nll": self.threshold if self.calibrator is None else _fitted_g_nll(self),
            "min_p_correct": self.min_p_correct,
            "rule": self.rule,
        }


def _best_p_correct(calibrator: Any) -> float:
    """The largest p_correct the calibration gives any G-NLL >= 0 (at 0 or at a knot of its map)."""
    knots = [x for x in calibrator.map_.get("x", []) if x > 0]
    if calibrator.map_.get("kind") == "platt" and calibrator.map_.get("coef", 0.0) > 0:
        return 1.0  # increasing in G-NLL: approaches 1 for large values
    return float(max(calibrator.predict_proba([0.0, *knots])))


def _fitted_g_nll(policy: AbstentionPolicy) -> float | None:
    if policy.rule is None or policy.calibrator is None:
        return None
    value = policy.calibrator.thresholds_[policy.rule].threshold
    return float(value) if math.isfinite(value) else None


def _rule_text(policy: AbstentionPolicy) -> str:
    if policy.min_p_correct is not None:
        return f" (abstain when p_correct < {policy.min_p_correct:g})"
    if policy.rule is None or policy.calibrator is None:
        return " (no abstention threshold fitted)"
    t = policy.calibrator.thresholds_[policy.rule]
    what = "accuracy among answered" if t.kind == "accuracy" else "fraction answered"
    if not math.isfinite(t.threshold):
        verdict = "abstains on every answer" if t.threshold < 0 else "answers everything"
        return (
            f" ({what} >= {t.target:g} with probability {1 - t.delta:g} is out of reach on the "
            f"calibration data: the rule {verdict})"
        )
    return (
        f" ({what} >= {t.target:g} with probability {1 - t.delta:g}: "
        f"answer when G-NLL <= {t.threshold:.3g})"
    )


def uncertainty_record(
    token_logprobs: Sequence[float] | np.ndarray,
    *,
    decoding: Literal["greedy", "sampled"],
    policy: AbstentionPolicy,
    tokens: Sequence[str] | None = None,
    top_logprobs: Sequence[dict[str, float]] | None = None,
    include_tokens: bool = False,
    source: str = "model",
    measured_logprobs: Sequence[float] | np.ndarray | None = None,
    prompt_format: str | None = None,
    reasoning: ReasoningSplit | None = None,
) -> Uncertainty:
    """The ``uncertainty`` record of one answer (see the module docstring for the fields).

    ``reasoning``: a reasoning model's :class:`~gnll.backends.reasoning.ReasoningSplit` (the
    answer's log-probs are the answer's only; the record then says so, :func:`reasoning_fields`).

    ``prompt_format``: how the request's prompt was rendered (:mod:`gnll.backends.prompting`).

    ``measured_logprobs`` (``Generation.measured_logprobs``) is what G-NLL is computed from when it
    differs from the answer's ``token_logprobs``: for an empty answer, its stop token's log-prob.
    An answer with no log-prob at all has no G-NLL: a :class:`LogprobError`, never "0, certain".
    Log-probs are checked once (:class:`~gnll.measures.logprobs.ValidLogprobs`: checked ones are
    taken as they are, and measured log-probs equal to the answer's are not checked again).
    """
    answer_lps = check_logprobs(token_logprobs, where=source, tokens=tokens)
    same = measured_logprobs is None or measured_logprobs is token_logprobs
    if not same and len(measured_logprobs or ()) == len(answer_lps):
        same = list(measured_logprobs or ()) == list(token_logprobs)  # a non-empty answer's
    lps = answer_lps if same else check_logprobs(measured_logprobs or [], where=source)
    if not lps.size:
        raise LogprobError(
            f"{source} gave an empty answer without the log-prob of the token that ended it: "
            "its G-NLL is undefined (an empty answer is scored by its stop token's log-prob)"
        )
    nll, ln = _g_nll(lps), _ln_g_nll(lps)
    greedy = decoding == "greedy"
    scored = "answer" if reasoning is not None else "output"
    p_correct, abstain = policy.decide(nll, prompt_format, scored) if greedy else (None, None)
    return Uncertainty(
        decoding=decoding,
        g_nll=nll if greedy else None,
        ln_g_nll=ln if greedy else None,
        nll=nll,
        num_tokens=len(answer_lps),
        p_correct=p_correct,
        abstain=abstain,
        prompt_format=prompt_format,
        tokens=list(tokens) if include_tokens and tokens is not None else None,
        token_logprobs=answer_lps.tolist() if include_tokens else None,
        top_logprobs=(
            [dict(t) for t in top_logprobs] if include_tokens and top_logprobs is not None else None
        ),
        # a reasoning model: G-NLL is the answer's, given prompt + trace
        **(reasoning_fields(reasoning) if reasoning is not None else {}),
    )


def reasoning_fields(split: ReasoningSplit) -> dict[str, Any]:
    """The fields a reasoning model's answer adds to its record (:class:`ReasoningSplit`).

    ``scored``: which tokens G-NLL sums (``"answer"``: the answer after the end-of-reasoning
    marker, conditioned on prompt + trace); ``trace_nll`` / ``trace_tokens``: the trace's (a
    trace measure, not the answer's uncertainty); ``answer_tokens``: the tokens after the marker
    (the terminator included); ``split_at``: the first answer token's index among all generated
    tokens; ``trace_confidence``: DeepConf's confidences of the trace (lowest group, tail,
    bottom 10%: :mod:`gnll.measures.trace`), which rank traces for voting and say nothing on
    the answer's correctness by themselves.
    """
    r = split.record()
    return {
        "scored": "answer",
        "trace_nll": r["trace_nll"],
        "trace_tokens": r["trace_tokens"],
        "marker_tokens": r["marker_tokens"],
        "answer_tokens": r["answer_tokens"],
        "split_at": r["split_at"],
        "reasoning_format": r["format"],
        "reasoning_source": r["source"],
        "trace_confidence": split.trace_confidence(),
        **({"notes": r["notes"]} if r.get("notes") else {}),
    }


def headers_for(records: Sequence[Uncertainty]) -> dict[str, str]:
    """``X-Uncertainty-*`` response headers: one comma-separated value per choice."""

    def fmt(v: object) -> str:
        if v is None:
            return "none"  # one choice among several without the value
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return f"{v:.6g}"
        return str(v)

    fields = {
        "G-NLL": "g_nll",
        "LN-G-NLL": "ln_g_nll",
        "NLL": "nll",
        "Tokens": "num_tokens",
        "Decoding": "decoding",
        "P-Correct": "p_correct",
        "Abstain": "abstain",
    }
    # A header none of the choices has a value for (P-Correct without a calibration) is left out.
    headers = {
        f"X-Uncertainty-{h}": ",".join(fmt(getattr(r, k)) for r in records)
        for h, k in fields.items()
        if any(getattr(r, k) is not None for r in records)
    }
    if any(r.answered_by is not None for r in records):  # --policy escalate
        headers["X-Answered-By"] = ",".join(fmt(r.answered_by) for r in records)
    return headers


def apply_policy(
    policy: AbstentionPolicy, text: str, finish_reason: str | None, record: Uncertainty
) -> tuple[str, str | None, Uncertainty]:
    """The answer text, finish reason and record a client sees under ``policy`` for one choice.

    ``finish_reason`` stays within OpenAI's values (``"length"`` still says the answer was cut);
    abstention is ``record.abstain``. A refused answer's record has ``refused`` set and no tokens or
    log-probs, so nothing the client receives reveals it.
    """
    if not record.abstain or policy.mode != "refuse":
        return text, finish_reason, record
    refused = record.model_copy(
        update={"refused": True, "tokens": None, "token_logprobs": None, "top_logprobs": None}
    )
    return policy.refusal, finish_reason, refused


def annotate(
    answers: Sequence[Answer],
    policy: AbstentionPolicy,
    *,
    include_tokens: bool,
    source: str = "model",
    prompt_format: str | None = None,
) -> tuple[list[Uncertainty], list[str], list[str | None]]:
    """Uncertainty records, client-visible texts and finish reasons of answers under ``policy``."""
    from gnll.serving.answer_spans import answer_spans

    records, texts, finishes = [], [], []
    for a in answers:
        # checked here once, for the record, its G-NLL and its spans alike
        lps = check_logprobs(a.token_logprobs, where=source, tokens=a.tokens)
        measured: list[float] | np.ndarray | None = a.measured_logprobs
        if measured is not None and list(measured) == list(a.token_logprobs):
            measured = lps  # a non-empty answer's: the same values
        rec = uncertainty_record(
            lps,
            decoding=a.decoding,
            policy=policy,
            tokens=a.tokens,
            top_logprobs=a.top_logprobs,
            include_tokens=include_tokens,
            source=source,
            prompt_format=prompt_format,
            measured_logprobs=measured,
            reasoning=a.reasoning,
        )
        if a.early is not None:
            rec = add_early(rec, a.early)
        text, finish, rec = apply_policy(policy, a.text, a.finish_reason, rec)
        # a refused answer gets no spans: they would reveal its text
        rec = rec.with_spans(None if rec.refused else answer_spans(a.text, a.tokens, lps))
        records.append(rec)
        texts.append(text)
        finishes.append(finish)
    return records, texts, finishes


def add_early(record: Uncertainty, facts: dict[str, Any]) -> Uncertainty:
    """The record of an answer that stopped at an exact early decision (:mod:`gnll.measures.early`).

    Its ``g_nll``, ``p_correct`` and ``num_tokens`` are those of the answer tokens released when
    the decision was made (a lower bound of the whole answer's G-NLL, an upper bound of its
    ``p_correct``); the rest of the answer was never generated.
    """
    return record.model_copy(
        update={
            "early": True,
            "decided_at_token": facts["decided_at_token"],
            "tokens_generated": facts["tokens_generated"],
            "tokens_saved": facts["tokens_saved"],
            "g_nll_is_lower_bound": True,
            "withheld": "the rest of the answer: never generated",
        }
    )
