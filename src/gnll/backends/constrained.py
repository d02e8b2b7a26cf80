"""What a model that can decode under a grammar offers (the hf backend: llguidance).

:class:`ConstrainedModel` is the optional hook ``gnll serve`` uses for a tool call the request
requires and for ``response_format`` JSON: greedy decoding restricted to the tokens a grammar
allows, reporting each token's raw log-prob (the model's distribution, what G-NLL sums) and its
constrained log-prob (renormalised over the allowed tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["ConstrainedGeneration", "ConstrainedModel"]


@dataclass
class ConstrainedGeneration:
    """One output decoded under a grammar.

    ``token_logprobs`` are ``log p(token)`` under the model's raw distribution (what a
    teacher-forced ``gnll score`` of the output gives); ``constrained_logprobs`` the same tokens
    renormalised over the tokens the grammar allowed (0 where it forced the token).
    """

    text: str
    token_ids: list[int]
    tokens: list[str]
    token_logprobs: list[float]
    constrained_logprobs: list[float]
    #: ``"stop"`` (the grammar ended, or the model ended where it could), ``"length"``, or
    #: ``"decided"`` (stopped by the caller's watch at an exact early decision).
    finish_reason: str
    #: The end-of-sequence token that ended the output, when the model chose one.
    terminator_token_ids: list[int] = field(default_factory=list)
    #: Whether the tokens are how the tokenizer writes the text (so a teacher-forced score of the
    #: text scores these very tokens); ``None``: not checked.
    canonical: bool | None = None


@runtime_checkable
class ConstrainedModel(Protocol):
    """A model with greedy decoding under a grammar (a Lark grammar in llguidance's dialect)."""

    def generate_constrained(
        self,
        prompt: str,
        grammar: str,
        *,
        max_new_tokens: int,
        raw_prompt: bool = False,
        watch: Callable[[str, float], bool] | None = None,
    ) -> ConstrainedGeneration:
        """Greedy decoding of ``prompt`` under ``grammar``; ``ValueError`` for a bad grammar.
        ``watch(token_text, raw_logprob)`` returning ``True`` stops decoding there (finish
        reason ``"decided"``: an exact early decision)."""
        ...

    def encode(self, prompts: Sequence[str], *, raw_prompt: bool = False) -> list[list[int]]:
        """The token ids the model conditions on for each prompt."""
        ...
