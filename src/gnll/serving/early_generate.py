"""Greedy answers that stop at an exact early decision, for batch jobs (``gnll generate --policy
refuse``): the in-process server's decoding loop and watch (:meth:`gnll.serving.engine.
BatchingEngine.run`, :class:`~gnll.serving.engine.EarlyStop`: the stop-string hold-back, then the
rule of :mod:`gnll.measures.early`), run in the calling thread. A reasoning model's trace runs to
its end; its answer, after the end-of-reasoning marker, stops at the decision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gnll.backends.base import Generation, GenerationConfig, Model
from gnll.measures.early import EarlyDecision, EarlyDecisionError
from gnll.policy import scored_of
from gnll.serving.engine import BatchingEngine

if TYPE_CHECKING:
    from gnll.policy import AbstentionPolicy

__all__ = ["EarlyGreedy", "early_greedy"]


def early_greedy(
    model: Model, policy: AbstentionPolicy, *, measures: Sequence[str], prompt_format: str
) -> EarlyGreedy:
    """``model`` with greedy answers that stop where ``policy`` refuses them whatever follows.

    Raises
    ------
    EarlyDecisionError
        Why no answer can be stopped early: the policy decides only at the end (its own message,
        naming its parameters), a measure other than G-NLL needs the whole answer, or the model
        (a reasoning model: the model it wraps) has no decoding loop to stop.
    """
    policy.early_decision(prompt_format=prompt_format)  # raises for a policy that cannot
    if list(measures) != ["g-nll"]:
        raise EarlyDecisionError(
            "the other measures need the whole answer (give measures g-nll)", param="measures"
        )
    engine = BatchingEngine(model)
    if not engine.decides_early:
        what = (
            f"{model.name} (the model it reasons with)"
            if model.capabilities.reasoning
            else model.name
        )
        raise EarlyDecisionError(f"{what} has no decoding loop to stop (the hf backend's)")
    return EarlyGreedy(engine, lambda: policy.early_decision(prompt_format=prompt_format))


class EarlyGreedy:
    """``model`` whose greedy answers stop at an exact early decision (:mod:`gnll.measures.early`).

    An answer ends at the first released token after which the policy refuses it whatever
    follows; the answer returned is the part released then (``finish_reason`` ``"decided"``).
    Everything else is the model's own. A stopped answer says where
    (:attr:`~gnll.backends.base.Generation.early`).
    """

    def __init__(self, engine: BatchingEngine, rule: Callable[[], EarlyDecision]) -> None:
        self.engine, self.model, self.rule = engine, engine.model, rule
        #: which tokens its G-NLL covers, the model's own (a calibration is checked against it)
        self.scored = scored_of(engine.model)

    def __getattr__(self, name: str) -> object:  # the rest of the Model: the model's own
        return getattr(self.model, name)

    def generate(
        self, prompts: Sequence[str], config: GenerationConfig | None = None, **kw: Any
    ) -> list[list[Generation]]:
        config = config or GenerationConfig.greedy()
        if config.strategy != "greedy" or config.num_sequences != 1:
            return self.model.generate(prompts, config, **kw)
        # The server's decoding loop, run here: one loop stops answers at their decisions.
        decoded = self.engine.run(prompts, config, raw=kw.get("raw_prompt", False), early=self.rule)
        return decoded.generations
