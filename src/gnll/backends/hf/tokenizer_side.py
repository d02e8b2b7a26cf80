"""The tokenizer side of gnll's HF backend, without the weights: for an engine that runs the model.

:mod:`gnll.distributed.vllm` puts gnll's arithmetic around a vLLM stage that holds the weights;
what it needs of the HF backend is how gnll renders, tokenises and ends an answer for that model
(chat template, special tokens, the joint prompt + answer tokenisation, EOS and stop tokens), so
that a vLLM score is the score gnll's own backend computes. This class is that side, in the
backend that owns it (callers outside ``gnll.backends`` use no internal of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from gnll.backends.base import DEFAULT_STOP, chat_messages, openai_turns

if TYPE_CHECKING:
    from gnll.backends.hf.model import HFModel

__all__ = ["TokenizerSide", "tokenizer_side"]


class TokenizerSide:
    """How gnll's HF backend renders, tokenises and ends answers for one model's tokenizer.

    Parameters
    ----------
    tokenizer:
        The model's Hugging Face tokenizer.
    chat_template:
        Whether prompts are rendered with the tokenizer's chat template (as the HF backend decides
        for the model: :func:`gnll.backends.hf.loading.use_chat_template`).
    eos_ids:
        The token ids that end a generation.
    """

    def __init__(self, tokenizer: Any, *, chat_template: bool, eos_ids: set[int]) -> None:
        self.tokenizer, self.chat_template, self.eos_ids = tokenizer, chat_template, set(eos_ids)

    @classmethod
    def from_pretrained(cls, source: str, *, chat_template: bool | None = None) -> TokenizerSide:
        """Read the tokenizer (and EOS ids) of ``source``; no weights."""
        from transformers import AutoTokenizer
        from transformers import GenerationConfig as HFGenerationConfig

        from gnll.backends.hf.loading import use_chat_template

        tok = AutoTokenizer.from_pretrained(source)
        eos = {tok.eos_token_id}
        try:
            gen_eos = HFGenerationConfig.from_pretrained(source).eos_token_id
        except OSError:
            gen_eos = None
        eos.update([gen_eos] if isinstance(gen_eos, int) else gen_eos or [])
        use = use_chat_template(chat_template, source, tok)
        return cls(tok, chat_template=use, eos_ids={i for i in eos if i is not None})

    @classmethod
    def from_model(cls, model: HFModel) -> TokenizerSide:
        """The tokenizer side of a loaded gnll HF model (tests; a CPU check of a GPU run)."""
        return cls(model.tokenizer, chat_template=model.chat_template, eos_ids=model.eos_ids)

    def render(self, prompt: str) -> str:
        """The text the model conditions on for a user prompt (``HFModel.render_prompt``)."""
        if not self.chat_template:
            return prompt
        return self.tokenizer.apply_chat_template(
            chat_messages(prompt), add_generation_prompt=True, tokenize=False
        )

    def render_chat(self, messages: list[dict[str, Any]]) -> str:
        """The text the model conditions on for a conversation (``developer`` as ``system``)."""
        return self.tokenizer.apply_chat_template(
            openai_turns(messages), add_generation_prompt=True, tokenize=False
        )

    def encode(self, text: str) -> list[int]:
        """The ids of a rendered prompt (special tokens added unless the template holds them)."""
        return list(self.tokenizer(text, add_special_tokens=not self.chat_template)["input_ids"])

    def encode_answer(self, text: str, answer: str) -> tuple[list[int], list[int], bool]:
        """Prompt ids, answer ids and whether a token merged across their boundary, from one joint
        tokenisation, as the HF backend scores an answer (``tokenize_answers``)."""
        from gnll.backends.hf.scoring import tokenize_answers

        prompt_ids, answer_ids, merged = tokenize_answers(
            self.tokenizer, [text], [answer], add_special_tokens=not self.chat_template
        )
        return prompt_ids[0], answer_ids[0], merged[0]

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids))

    @cached_property
    def end_ids(self) -> frozenset[int]:
        """Tokens whose greedy choice ends an answer (``greedy_stops``)."""
        from gnll.backends.hf.scoring import answer_end_ids
        from gnll.backends.hf.stopping import StopRules

        return answer_end_ids(self.tokenizer, StopRules(self.tokenizer, DEFAULT_STOP, self.eos_ids))

    @property
    def placeholder_id(self) -> int:
        """A token to send for a row that cannot be asked (an engine needs a prompt on every row)."""
        return self.tokenizer.bos_token_id or self.tokenizer.eos_token_id or 0


def tokenizer_side(model: Any, **kwargs: Any) -> TokenizerSide:
    """The :class:`TokenizerSide` of ``model``: a checkpoint name or path, a loaded
    :class:`~gnll.backends.hf.HFModel`, or a tokenizer (with ``chat_template`` and ``eos_ids``)."""
    if isinstance(model, str):
        return TokenizerSide.from_pretrained(model, **kwargs)
    if kwargs:
        return TokenizerSide(model, **kwargs)
    return TokenizerSide.from_model(model)
