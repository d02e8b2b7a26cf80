"""Greedy answers that stop at an exact early decision, for batch jobs (``gnll generate --policy
refuse``): the in-process server's watch (:class:`gnll.serving.engine.EarlyStop`, the stop-string
hold-back, then the rule of :mod:`gnll.measures.early`) on the model's own decoding loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from gnll.backends.base import Generation, GenerationConfig, Model, StreamingModel
from gnll.backends.reasoning_model import ReasoningModel
from gnll.measures.early import EarlyDecision, EarlyDecisionError
from gnll.serving.engine import EarlyStop
from gnll.serving.streams.live import HeldText

if TYPE_CHECKING:
    from gnll.serving.uncertainty import AbstentionPolicy

__all__ = ["EarlyGreedy", "early_greedy"]


def early_greedy(
    model: Model, policy: AbstentionPolicy, *, measures: Sequence[str], prompt_format: str
) -> EarlyGreedy:
    """``model`` with greedy answers that stop where ``policy`` refuses them whatever follows.

    Raises
    ------
    EarlyDecisionError
        Why no answer can be stopped early: the policy decides only at the end (its own message,
        naming its parameters), a measure other than G-NLL needs the whole answer, a reasoning
        model's answer starts after its trace, or the model has no decoding loop to stop.
    """
    policy.early_decision(prompt_format=prompt_format)  # raises for a policy that cannot
    if list(measures) != ["g-nll"]:
        raise EarlyDecisionError(
            "the other measures need the whole answer (give measures g-nll)", param="measures"
        )
    if isinstance(model, ReasoningModel):
        raise EarlyDecisionError(
            "a reasoning model's answer starts after its trace (not supported here)"
        )
    if not model.capabilities.streaming:
        raise EarlyDecisionError(f"{model.name} has no decoding loop to stop (the hf backend's)")
    return EarlyGreedy(
        cast(StreamingModel, model), lambda: policy.early_decision(prompt_format=prompt_format)
    )


class EarlyGreedy:
    """``model`` whose greedy answers stop at an exact early decision (:mod:`gnll.measures.early`).

    An answer ends at the first released token after which the policy refuses it whatever
    follows; the answer returned is the part released then (``finish_reason`` ``"decided"``).
    Everything else is the model's own. :meth:`facts` gives the last greedy answer's decision.
    """

    def __init__(self, model: StreamingModel, rule: Callable[[], EarlyDecision]) -> None:
        self.model, self.rule = model, rule
        self._facts: list[dict[str, Any] | None] = []

    def __getattr__(self, name: str) -> object:  # the rest of the Model: the model's own
        return getattr(self.model, name)

    def facts(self) -> dict[str, Any] | None:
        """The last greedy answer's early decision (``None``: it ran to its end)."""
        return self._facts[0] if len(self._facts) == 1 else None

    def generate(
        self, prompts: Sequence[str], config: GenerationConfig | None = None, **kw: Any
    ) -> list[list[Generation]]:
        config = config or GenerationConfig.greedy()
        if config.strategy != "greedy" or config.num_sequences != 1:
            return cast(Model, self.model).generate(prompts, config, **kw)
        lm = self.model
        ids = lm.encode(prompts, raw_prompt=kw.get("raw_prompt", False))
        lm.check_context(ids, config.max_new_tokens)
        stops = lm.stop_rules(config.stop)
        decoder = lm.open_decoder(config, width=max(1, len(ids)))
        watches = [
            EarlyStop(HeldText(lm.decode, stops.token_ids, stops.strings), self.rule(), n)
            for n in [config.max_new_tokens] * len(ids)
        ]
        for i, row in enumerate(ids):
            decoder.add(
                i,
                row,
                max_new_tokens=config.max_new_tokens,
                stops=stops,
                watch=lambda j, token, lp, w=watches[i]: w(token, lp),
            )
        out: list[list[Generation]] = [[] for _ in ids]
        while decoder.busy:
            for i, gens in decoder.step():
                out[i] = [watches[i].generation()] if watches[i].rule.decided else gens
        self._facts = [w.facts() if w.rule.decided else None for w in watches]
        return out
