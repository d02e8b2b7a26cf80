"""Prompts and model variants shared by the hf backend's decoding tests (fast loop, beams)."""

from __future__ import annotations

from collections.abc import Sequence

from gnll.backends.hf import HFModel

FEW_SHOT = (
    "Answer the following question as briefly as possible.\n"
    "Question: What is the largest ocean?\nAnswer: The Pacific Ocean\n\n"
    "Question: Who painted the Mona Lisa?\nAnswer: Leonardo da Vinci\n\n"
    "Question: {q}\nAnswer:"
)
QUESTIONS = [
    "What is the capital of France?",
    "Which planet is known as the red planet?",
    "Who wrote the novel Moby-Dick, published in 1851?",
    "In which year did the Second World War end?",
    "What is the chemical symbol for gold?",
    "Which composer wrote the Moonlight Sonata?",
]


def few_shot(questions: Sequence[str]) -> list[str]:
    """Few-shot prompts that share a long prefix (the shared-prefix path of the loop)."""
    return [FEW_SHOT.format(q=q) for q in questions]


def variant(model: HFModel, **kwargs) -> HFModel:
    """The same weights and tokenizer with other decoding or batching options (``decoder``,
    ``beam_decoder``, ``batch_size``, ...)."""
    options = {
        "name": model.name,
        "chat_template": model.chat_template,
        "batch_size": model.batch_size,
        "max_batch_tokens": model.max_batch_tokens,
        **kwargs,
    }
    return HFModel(model.model, model.tokenizer, **options)
