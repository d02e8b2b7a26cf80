"""Model backends: adapters that turn prompts into :class:`Generation` objects with token log-probs."""

from typing import Any

from gnll.backends.base import DEFAULT_STOP, EmptyAnswerError, Generation, GenerationConfig, Model
from gnll.backends.registry import EMBEDDED_MODELS, get_backend, load_model

__all__ = [
    "DEFAULT_STOP",
    "EMBEDDED_MODELS",
    "EmptyAnswerError",
    "Generation",
    "GenerationConfig",
    "Model",
    "load_model",
    "tokenizer_side",
]


def tokenizer_side(model: Any, *, backend: str = "hf", **kwargs: Any) -> Any:
    """A backend's tokenizer side of a model whose weights another engine runs (vLLM).

    For the hf backend (:func:`gnll.backends.hf.tokenizer_side.tokenizer_side`), ``model`` is a
    checkpoint name or path (its tokenizer is read, no weights; ``chat_template`` may be given),
    a loaded hf model, or a tokenizer with ``chat_template`` and ``eos_ids``. Reached through the
    registry, so callers outside the backends import nothing of the backend's internals.
    """
    side = get_backend(backend).tokenizer_side
    if side is None:
        raise ValueError(f"backend {backend!r} has no tokenizer side to lend")
    return side(model, **kwargs)
