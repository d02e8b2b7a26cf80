"""What an exact early decision did to an answer: where it stopped and what that saved.

The rule that decides is :class:`gnll.measures.early.EarlyDecision` (running, per answer); this is
its outcome once an answer stopped at it, carried by the answer itself
(:attr:`gnll.backends.base.Generation.early`, ``gnll.policy.Answer.early``). Every producer fills
it (the decoding loop's watch, a proxy's watch of an upstream stream) and every record writer
(the ``uncertainty`` record of ``gnll serve``, a ``gnll generate`` row) takes its fields from
:meth:`EarlyDecided.record`, so the fields are spelled in one place.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["EarlyDecided"]


@dataclass(frozen=True)
class EarlyDecided:
    """An answer stopped at its exact early decision.

    Attributes
    ----------
    decided_at_token:
        Answer tokens released when the decision became exact (the answer kept is these tokens;
        ``0``: decided before the first one).
    tokens_generated:
        Tokens generated until the answer stopped (answer, held-back and reasoning tokens).
    tokens_saved:
        Tokens of the answer's budget never generated (``max_tokens`` minus
        ``tokens_generated``); ``None`` when the budget is unknown (an upstream's own limit).
    action:
        What the decision was: ``"refuse"`` or ``"escalate"``.

    Examples
    --------
    >>> EarlyDecided(3, 5, 45, "refuse").record()
    {'early': True, 'decided_at_token': 3, 'tokens_generated': 5, 'tokens_saved': 45, 'g_nll_is_lower_bound': True}
    """

    decided_at_token: int
    tokens_generated: int
    tokens_saved: int | None
    action: str | None = None

    def record(self) -> dict[str, Any]:
        """The fields an answer's record carries for it (in this order): its G-NLL covers the
        tokens released by the decision, a lower bound of the whole answer's."""
        return {
            "early": True,
            "decided_at_token": self.decided_at_token,
            "tokens_generated": self.tokens_generated,
            "tokens_saved": self.tokens_saved,
            "g_nll_is_lower_bound": True,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EarlyDecided:
        return cls(**data)
