"""Exact early decisions: refuse or escalate at the first answer token where the decision is certain.

G-NLL is ``-sum_t log p(y_t | ...)``, a sum of non-negative token NLLs, so the G-NLL of the answer
tokens released so far never exceeds the whole answer's. A policy whose "abstain" set is closed
upwards in G-NLL (``G-NLL > tau``; a calibrated ``p_correct`` below a target through a
non-increasing map) therefore abstains on the whole answer as soon as it abstains on a released
prefix: the decision is **known exactly** there, and the rest of the answer need not be generated.
"Answer" (accept) stays an end-of-answer decision: a later token may still push G-NLL over the
threshold.

Three rules make "released prefix" precise, and :class:`EarlyDecision` takes them as inputs rather
than guessing them:

- only tokens that are certainly part of the answer count: a token held back because it may begin a
  stop string (``"Question"`` before ``":"``) may be cut from the answer, so the caller pushes a
  token only once it is released (:class:`gnll.backends.held.HeldText` says when);
- for a reasoning model, the sum starts after the end-of-reasoning marker: tokens pushed with
  ``answer=False`` are counted as generated but never enter the sum;
- an empty answer is scored by the log-prob of the token that ended it (the empty-answer rule of
  :attr:`gnll.backends.Generation.measured_logprobs`): that token never counts while the answer is
  running, so a prefix sum of 0 stands for both cases, and :meth:`EarlyDecision.finish` applies the
  rule at the end.

The running sum is computed by :func:`gnll.measures.g_nll` itself (the same log-prob clamping, the
same correctly rounded ``math.fsum``), so the comparison with the threshold is the one the finished
answer gets, bit for bit: ``<=`` against ``<`` is whatever the policy's own predicate says.

Examples
--------
>>> rule = EarlyDecision(lambda g: g > 1.0, action="escalate")
>>> [rule.push(lp).state for lp in (-0.5, -0.4, -0.3)]
['undecided', 'undecided', 'decided']
>>> d = rule.decision
>>> d.action, d.at_token, round(d.g_nll, 3)
('escalate', 3, 1.2)
>>> EarlyDecision(lambda g: g > 1.0).finish([-0.5, -0.4]).state  # the end of the answer: accepted
'accepted'
>>> EarlyDecision(lambda g: g > 1.0, measure="ln-g-nll")
Traceback (most recent call last):
...
gnll.measures.early.EarlyDecisionError: early decisions need a measure that can only grow as answer tokens arrive (g-nll: a sum of non-negative token NLLs); 'ln-g-nll' can fall again after it crosses a threshold, so its decision is known only at the end of the answer
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from gnll._util.validation import ParameterError
from gnll.measures.functions import g_nll
from gnll.measures.logprobs import check_logprobs

__all__ = [
    "MONOTONE_MEASURES",
    "Decision",
    "EarlyDecision",
    "EarlyDecisionError",
    "check_nonincreasing",
]

#: Measures that can only grow as answer tokens are added (the others, e.g. LN-G-NLL, a mean, can
#: fall again, so no decision on them is exact before the end).
MONOTONE_MEASURES: tuple[str, ...] = ("g-nll",)


class EarlyDecisionError(ParameterError):
    """A policy or measure on which no decision is exact before the end of the answer.

    A :class:`gnll._util.validation.ParameterError`: ``param`` and ``others`` name the parameters
    the message mentions, so a command line can name its options. Unlike other parameter errors
    its message is a sentence that need not start with the parameter (``param`` may be ``None``
    when the cause is the calibration map or the model rather than one parameter).
    """

    def __init__(
        self, message: str, *, param: str | None = None, others: tuple[str, ...] = ()
    ) -> None:
        ValueError.__init__(self, message)
        self.param = param  # type: ignore[assignment]
        self.problem = message
        self.others = others


@dataclass(frozen=True)
class Decision:
    """Where an answer's decision stands.

    Attributes
    ----------
    state:
        ``"undecided"`` (the answer is still running and the policy may go either way),
        ``"decided"`` (the policy abstains: ``action``), or ``"accepted"`` (the answer ended and the
        policy keeps it; only ever at the end).
    action:
        ``"refuse"`` or ``"escalate"`` when decided, else ``None``.
    at_token:
        Answer tokens released when the decision became exact (``0``: before the first one, for a
        policy that abstains on every answer); ``None`` while undecided.
    generated:
        Tokens generated at that moment (answer, held-back and reasoning tokens).
    g_nll:
        G-NLL of the released answer tokens: a lower bound of the answer's G-NLL until the end.
    final:
        Whether the whole answer was seen (``False`` for a decision made early).
    """

    state: Literal["undecided", "decided", "accepted"]
    action: str | None = None
    at_token: int | None = None
    generated: int = 0
    g_nll: float = 0.0
    final: bool = False

    @property
    def abstain(self) -> bool | None:
        return {"decided": True, "accepted": False}.get(self.state)


class EarlyDecision:
    """The running decision of one answer under a policy that is monotone in G-NLL.

    Parameters
    ----------
    abstains:
        The policy's own predicate on a G-NLL value (``True``: abstain). It must be monotone:
        ``abstains(g)`` implies ``abstains(h)`` for every ``h >= g``. Threshold rules are; a
        calibrated map is when it is non-increasing (:func:`check_nonincreasing`).
    action:
        What abstaining means here: ``"refuse"`` or ``"escalate"`` (reported, not acted on).
    measure:
        The measure the policy reads; only :data:`MONOTONE_MEASURES` allow early decisions.
    where:
        Names the answer in error messages.

    Examples
    --------
    Tokens held back for a possible stop string are not pushed until released; reasoning tokens are
    pushed with ``answer=False`` and never count:

    >>> rule = EarlyDecision(lambda g: g > 2.0)
    >>> rule.push(-5.0, answer=False).state  # a thinking token: not part of the answer
    'undecided'
    >>> rule.push(-2.5).at_token, rule.decision.generated
    (1, 2)
    """

    def __init__(
        self,
        abstains: Callable[[float], bool],
        *,
        action: str = "refuse",
        measure: str = "g-nll",
        where: str = "answer",
    ) -> None:
        if measure not in MONOTONE_MEASURES:
            raise EarlyDecisionError(
                "early decisions need a measure that can only grow as answer tokens arrive "
                f"({', '.join(MONOTONE_MEASURES)}: a sum of non-negative token NLLs); {measure!r} "
                "can fall again after it crosses a threshold, so its decision is known only at the "
                "end of the answer"
            )
        if action not in ("refuse", "escalate"):
            raise ValueError(f"action must be 'refuse' or 'escalate', got {action!r}")
        self.abstains, self.action, self.where = abstains, action, where
        self.logprobs: list[float] = []  # released answer tokens' log-probs
        self.generated = 0
        self.decision = Decision("undecided")
        self._check()  # a policy that abstains on G-NLL 0 abstains on every answer: decided at 0

    @property
    def decided(self) -> bool:
        return self.decision.state == "decided"

    def push(self, logprob: float, *, answer: bool = True) -> Decision:
        """Take the next generated token, released at once: ``answer=True`` for an answer token,
        ``False`` for a token outside the answer (reasoning, its end marker). Returns the decision
        so far; once decided it stays decided."""
        self.generated += 1
        return self.release([logprob]) if answer else self.decision

    def skip(self, n: int = 1) -> None:
        """Count ``n`` generated tokens that are not released yet (held back for a possible stop
        string); :meth:`release` adds them to the sum once they are."""
        self.generated += n

    def release(self, logprobs: Sequence[float], tokens: Sequence[str] | None = None) -> Decision:
        """Answer tokens released, in order (already counted as generated by :meth:`skip`);
        ``tokens``: their texts, for a rule that reads them (a tool call's,
        :class:`gnll.toolwatch.ToolCallDecision`); this one does not."""
        for lp in logprobs:
            if self.decided:
                break
            self.logprobs.append(float(check_logprobs([lp], where=self.where)[0]))
            self._check()
        return self.decision

    def _check(self) -> None:
        g = g_nll(self.logprobs)
        if self.abstains(g):
            self.decision = Decision(
                "decided", self.action, len(self.logprobs), self.generated, g, final=False
            )

    def finish(
        self, answer_logprobs: Sequence[float], stop_logprob: float | None = None
    ) -> Decision:
        """The end-of-answer decision on the finished answer (what a policy decides without early
        decisions): ``answer_logprobs`` are the answer tokens' log-probs, ``stop_logprob`` the
        log-prob of the token that ended it (needed only for an empty answer: its G-NLL).

        It does not look at what was pushed: comparing the two is how early decisions are checked.
        """
        lps = list(answer_logprobs)
        if not lps:
            if stop_logprob is None:
                raise ValueError(
                    f"{self.where}: the answer is empty and the log-prob of the token that ended "
                    "it is unknown: its G-NLL is undefined (an empty answer is scored by its stop "
                    "token's log-prob)"
                )
            lps = [stop_logprob]
        g = g_nll(check_logprobs(lps, where=self.where))
        if self.abstains(g):
            return Decision("decided", self.action, len(answer_logprobs), self.generated, g, True)
        return Decision("accepted", None, None, self.generated, g, True)


def check_nonincreasing(xs: Sequence[float], ys: Sequence[float], *, what: str) -> None:
    """Refuse a piecewise-linear map ``x -> y`` (knots ``xs``, ``ys``) that is not non-increasing:
    a ``p_correct`` that rises again with G-NLL cannot be decided before the end of the answer.

    Examples
    --------
    >>> check_nonincreasing([0.0, 1.0, 2.0], [0.9, 0.5, 0.5], what="the map")
    >>> check_nonincreasing([0.0, 1.0, 2.0], [0.9, 0.5, 0.6], what="the map")
    Traceback (most recent call last):
    ...
    gnll.measures.early.EarlyDecisionError: the map is not monotone: p_correct rises from 0.5 at G-NLL 1 to 0.6 at G-NLL 2, so an answer it rejects part-way may be accepted at its end; early decisions need a non-increasing map (gnll calibrate fits one)
    """
    pairs = list(zip(xs, ys, strict=True))
    for (x0, y0), (x1, y1) in zip(pairs, pairs[1:], strict=False):
        if x1 < x0:
            raise EarlyDecisionError(f"{what}: its knots are not sorted by G-NLL ({x0:g} > {x1:g})")
        if y1 > y0:
            raise EarlyDecisionError(
                f"{what} is not monotone: p_correct rises from {y0:g} at G-NLL {x0:g} to {y1:g} "
                f"at G-NLL {x1:g}, so an answer it rejects part-way may be accepted at its end; "
                "early decisions need a non-increasing map (gnll calibrate fits one)"
            )
