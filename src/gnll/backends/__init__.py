"""Model backends: adapters that turn prompts into :class:`Generation` objects with token log-probs."""

from gnll.backends.base import DEFAULT_STOP, EmptyAnswerError, Generation, GenerationConfig, Model
from gnll.backends.registry import EMBEDDED_MODELS, load_model

__all__ = [
    "DEFAULT_STOP",
    "EMBEDDED_MODELS",
    "EmptyAnswerError",
    "Generation",
    "GenerationConfig",
    "Model",
    "load_model",
]
