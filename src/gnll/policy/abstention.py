"""The :class:`AbstentionPolicy`: what to do with answers that are likely wrong, checked when it is
built, and the steps every surface takes through it (see :mod:`gnll.policy`)."""

from __future__ import annotations

import math
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Iterator,
    Mapping,
)
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import numpy as np

from gnll._util.validation import ParameterError
from gnll.measures.early import EarlyDecision, EarlyDecisionError, check_nonincreasing
from gnll.measures.logprobs import check_logprobs
from gnll.policy.answers import (
    Answer,
    Decided,
    add_early,
    answer_spans,
    apply_policy,
    uncertainty_record,
)

if TYPE_CHECKING:
    from gnll.calibration import Calibrator
    from gnll.calibration.cascade import CascadeThreshold

__all__ = ["DEFAULT_REFUSAL", "MODES", "AbstentionPolicy", "Mode"]

T = TypeVar("T")

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
    scored:
        Which tokens the served model's G-NLL covers: ``"answer"`` (a reasoning model's answer
        after its end-of-reasoning marker) or ``"output"``; a calibration fitted on the other kind
        is refused (its ``p_correct`` would never apply). ``None``: not known yet
        (:meth:`check_scored` checks it later).

    A policy that must decide (``flag``, ``refuse``, ``escalate``) needs a calibrator or a
    threshold, and a ``refuse`` rule that would refuse every answer is refused. Errors name the
    parameter (:class:`gnll._util.validation.ParameterError`).

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
    scored: str | None = None

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
        self.check_rule(self.mode, calibrated=self.calibrator is not None, threshold=self.threshold)
        if (
            self.mode in ("refuse", "escalate")
            and self.calibrator is not None
            and self.rule is None
            and self.min_p_correct is None
        ):
            raise ParameterError(
                "mode",
                f"{self.mode!r}: the calibration has no fitted threshold to decide by (gnll "
                "calibrate fits one); give min_p_correct",
                others=("min_p_correct",),
            )
        useless = self.refuses_everything() if self.mode == "refuse" else None
        if useless:
            raise ParameterError(
                "mode",
                f"'refuse' would refuse every answer: {useless.strip()}; choose another rule, "
                "min_p_correct or threshold",
                others=("rule", "min_p_correct", "threshold"),
            )
        self.check_scored(self.scored)

    @staticmethod
    def check_rule(mode: str, *, calibrated: bool, threshold: float | None) -> None:
        """The policy's rules that need no calibration file read: a mode that decides has a rule
        (a calibration or a threshold), and not both. A command checks its options with it before
        it loads anything; the policy runs it when it is built."""
        if calibrated and threshold is not None:
            raise ParameterError(
                "threshold",
                "cannot be given with calibrator (give one of them)",
                others=("calibrator",),
            )
        if mode != "annotate" and not calibrated and threshold is None:
            raise ParameterError(
                "mode",
                f"{mode!r} needs calibrator or threshold",
                others=("calibrator", "threshold"),
            )

    def check_scored(self, scored: str | None) -> None:
        """Refuse (:class:`ParameterError` naming ``calibrator``) a calibration fitted on other
        answers than a model's ``scored`` ones (``"answer"``: a reasoning model's answer after its
        marker; ``"output"``: the whole output): it would never decide. ``None``: no check."""
        if self.calibrator is None or scored is None:
            return
        from gnll.calibration import scored_mismatch

        why = scored_mismatch(self.calibrator, scored)
        if why is not None:
            raise ParameterError(
                "calibrator", f"does not fit this model: {why}", others=("scored",)
            )

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

    @overload
    def decide(
        self, answer: float, prompt_format: str | None = None, scored: str | None = None
    ) -> tuple[float | None, bool | None]: ...

    @overload
    def decide(
        self,
        answer: Answer,
        prompt_format: str | None = None,
        scored: None = None,
        *,
        include_tokens: bool = False,
        source: str = "model",
    ) -> Decided: ...

    def decide(
        self,
        answer: float | Answer,
        prompt_format: str | None = None,
        scored: str | None = None,
        *,
        include_tokens: bool = False,
        source: str = "model",
    ) -> tuple[float | None, bool | None] | Decided:
        """What this policy makes of one answer.

        Given an :class:`Answer`: its :class:`Decided` (the ``uncertainty`` record, with spans and
        early-decision facts, and the text and finish reason the caller sees: the refusal when
        ``refuse`` abstains). ``prompt_format``: how its prompt was rendered; ``include_tokens``:
        keep its tokens and log-probs in the record; ``source``: who produced it, for errors.

        Given a greedy answer's G-NLL: ``(p_correct, abstain)`` (``None`` when not configured, or
        when the calibration was fitted on another prompt format than the answer's, or on answers
        split otherwise: ``scored`` is ``"answer"`` for a reasoning model's, ``"output"`` else).
        """
        if isinstance(answer, Answer):
            return self._decided(answer, prompt_format, include_tokens, source)
        return self._judge(float(answer), prompt_format, scored)

    def _judge(
        self, g_nll: float, prompt_format: str | None, scored: str | None
    ) -> tuple[float | None, bool | None]:
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
            return bool(self._judge(g, prompt_format, None)[1])

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

    def _decided(
        self, a: Answer, prompt_format: str | None, include_tokens: bool, source: str
    ) -> Decided:
        # checked here once, for the record, its G-NLL and its spans alike
        lps = check_logprobs(a.token_logprobs, where=source, tokens=a.tokens)
        measured: list[float] | np.ndarray | None = a.measured_logprobs
        if measured is not None and list(measured) == list(a.token_logprobs):
            measured = lps  # a non-empty answer's: the same values
        rec = uncertainty_record(
            lps,
            decoding=a.decoding,
            policy=self,
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
        text, finish, rec = apply_policy(self, a.text, a.finish_reason, rec)
        # a refused answer gets no spans: they would reveal its text
        rec = rec.with_spans(None if rec.refused else answer_spans(a.text, a.tokens, lps))
        return Decided(rec, text, finish)

    @property
    def withholds(self) -> bool:
        """Whether a greedy answer may be withheld from the caller (``refuse`` replaces it,
        ``escalate`` asks a larger model instead)."""
        return self.mode in ("refuse", "escalate") and self.active

    @property
    def takes_sampled(self) -> bool:
        """Whether a sampled request (temperature > 0) is served: not under ``refuse``, which
        decides on the greedy answer's G-NLL (a sampled answer has none, so it would never be
        refused)."""
        return not (self.mode == "refuse" and self.active)

    def holds(self, *, greedy: bool = True) -> bool:
        """Whether a stream of this answer must be held until the answer is decided: it may be
        withheld, and it is greedy (a sampled answer has no G-NLL, so nothing to decide on)."""
        return self.withholds and greedy

    def pin(self, request: Mapping[str, Any], *, top_logprobs: int = 1) -> dict[str, Any]:
        """``request`` (OpenAI chat keyword arguments) as this policy needs it: log-probs on, at
        least ``top_logprobs`` alternatives, and greedy decoding when no temperature is given.

        Raises
        ------
        ParameterError
            ``temperature`` > 0 under ``refuse``: the policy decides on the greedy answer.

        Examples
        --------
        >>> AbstentionPolicy().pin({"model": "m", "top_logprobs": 3})
        {'model': 'm', 'top_logprobs': 3, 'logprobs': True, 'temperature': 0.0}
        """
        out = dict(request)
        temperature = out.get("temperature")
        if temperature and not self.takes_sampled:
            raise ParameterError(
                "temperature",
                "the refuse policy decides on the greedy answer: send temperature 0 or none",
            )
        out["logprobs"] = True
        out["top_logprobs"] = max(int(out.get("top_logprobs") or 0), top_logprobs)
        if temperature is None:
            out["temperature"] = 0.0
        return out

    def wrap(
        self,
        stream: Iterable[T],
        settle: Callable[[list[T]], Iterable[T]],
        *,
        greedy: bool = True,
    ) -> Iterator[T]:
        """Relay ``stream``, holding what the caller may not see before the answer is decided.

        ``settle(unsent)`` is called once the stream has ended, with the pieces not sent yet: all
        of them when this policy :meth:`holds` the stream (``refuse``, ``escalate``), else the last
        one only (the others went out as they came). It decides the answer (the caller
        accumulates what it needs while the pieces pass) and returns what to send: the held
        pieces with the record on the last, or the refusal alone. So no byte of a refused answer
        reaches the caller before the refusal.
        """
        held: list[T] = []
        hold = self.holds(greedy=greedy)
        for piece in stream:
            if held and not hold:
                yield held.pop()
            held.append(piece)
        yield from settle(held)

    async def awrap(
        self,
        stream: AsyncIterable[T],
        settle: Callable[[list[T]], Iterable[T] | AsyncIterable[T]],
        *,
        greedy: bool = True,
    ) -> AsyncIterator[T]:
        """:meth:`wrap` for an async stream (``settle`` may be an async generator: an escalation
        asks another model before it knows what to send)."""
        held: list[T] = []
        hold = self.holds(greedy=greedy)
        async for piece in stream:
            if held and not hold:
                yield held.pop()
            held.append(piece)
        settled = settle(held)
        if isinstance(settled, AsyncIterable):
            async for piece in settled:
                yield piece
        else:
            for piece in settled:
                yield piece

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
