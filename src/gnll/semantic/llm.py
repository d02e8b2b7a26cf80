"""LLM-entailment clusterer: ask a language model whether one answer entails the other, both ways.

The wording is the reference code's (Farquhar et al. 2024, the prompt of their local-LLM entailment
model)::

    We are evaluating answers to the question "{question}"
    Here are two possible answers:
    Possible Answer 1: {text1}
    Possible Answer 2: {text2}
    Does Possible Answer 1 semantically entail Possible Answer 2? Respond only with entailment, \
    contradiction, or neutral.
    Response:

(the question line ends after "neutral."; it is split here only for width).

The reply is read greedily up to a newline. Parsing follows the reference (first 30 lower-cased
characters), except that when several of the three words occur the *earliest* wins (the reference
checks "entailment" first, which misreads e.g. "contradiction, not entailment"); a reply with none
of them counts as neutral, as in the reference, and is counted in
``stats.extra["unparsed_replies"]``.
"""

from __future__ import annotations

from typing import Any

from gnll.semantic.base import CONTRADICTION, ENTAILMENT, NEUTRAL, PairwiseClusterer

__all__ = ["ENTAILMENT_PROMPT", "LLMEntailmentClusterer", "entailment_prompt", "parse_entailment"]

ENTAILMENT_PROMPT = (
    'We are evaluating answers to the question "{question}"\n'
    "Here are two possible answers:\n"
    "Possible Answer 1: {text1}\nPossible Answer 2: {text2}\n"
    "Does Possible Answer 1 semantically entail Possible Answer 2? "
    "Respond only with entailment, contradiction, or neutral.\n"
    "Response:"
)

_STEMS = ((ENTAILMENT, "entail"), (CONTRADICTION, "contradict"), (NEUTRAL, "neutral"))


def entailment_prompt(question: str, text1: str, text2: str) -> str:
    """The entailment question for ``text1 => text2``."""
    return ENTAILMENT_PROMPT.format(question=question, text1=text1, text2=text2)


def parse_entailment(reply: str) -> str | None:
    """``entailment``/``contradiction``/``neutral`` from a model reply, or ``None`` if none is
    named.

    >>> parse_entailment(" Entailment."), parse_entailment("contradiction, not entailment")
    ('entailment', 'contradiction')
    >>> parse_entailment("I think so") is None
    True
    """
    head = reply.strip().lower()[:30]
    found = [(head.find(stem), label) for label, stem in _STEMS if stem in head]
    return min(found)[1] if found else None


class LLMEntailmentClusterer(PairwiseClusterer):
    """Semantic clustering by bidirectional entailment judged by a language model.

    Parameters
    ----------
    model:
        A :class:`gnll.backends.Model`, or a name for :func:`gnll.backends.load_model` (e.g. the
        embedded ``smollm2-135m-instruct``).
    relation:
        ``"strict"`` (default) or ``"loose"``, as for :class:`~gnll.semantic.NLIClusterer`.
    max_new_tokens:
        Length cap of the reply (the label is in its first words).
    batch_size:
        Passed to ``model.generate``. All prompts of one partition step, across the questions of a
        :meth:`cluster_many` call, go to one ``generate`` call.
    model_args:
        Extra arguments for ``load_model`` when ``model`` is a name.
    """

    name = "llm"

    def __init__(
        self,
        model: Any = "smollm2-135m-instruct",
        relation: str = "strict",
        *,
        max_new_tokens: int = 8,
        batch_size: int | None = None,
        **model_args: Any,
    ) -> None:
        super().__init__(relation)
        if isinstance(model, str):
            from gnll.backends import load_model

            model = load_model(model, **model_args)
        elif model_args:
            raise TypeError(f"model arguments {sorted(model_args)} need a model name, not a Model")
        from gnll.backends import GenerationConfig

        self.model = model
        self.config = GenerationConfig.greedy(max_new_tokens=int(max_new_tokens), stop=("\n",))
        self.batch_size = int(batch_size) if batch_size is not None else None
        self.stats.extra["unparsed_replies"] = 0
        #: Raw reply of every (question, answer 1, answer 2) asked so far, for inspection.
        self.replies: dict[tuple[str, str, str], str] = {}

    def _predict_directional(self, triples: list[tuple[str, str, str]]) -> list[str]:
        prompts = [entailment_prompt(q, a, b) for q, a, b in triples]
        outputs = self.model.generate(prompts, self.config, batch_size=self.batch_size)
        self.stats.model_calls += 1
        labels = []
        for triple, gens in zip(triples, outputs, strict=True):
            reply = gens[0].text if gens else ""
            self.replies[triple] = reply
            label = parse_entailment(reply)
            if label is None:
                self.stats.extra["unparsed_replies"] += 1
                label = NEUTRAL
            labels.append(label)
        return labels

    def info(self) -> dict[str, Any]:
        return {
            **super().info(),
            "model": self.model.name or self.model.info().get("name"),
            "prompt": "farquhar2024-entailment",
            "max_new_tokens": self.config.max_new_tokens,
        }
