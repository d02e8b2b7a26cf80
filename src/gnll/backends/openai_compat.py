"""Kept for imports written before the server backend became the :mod:`gnll.backends.openai` package."""

from gnll.backends.openai import OpenAICompatModel

__all__ = ["OpenAICompatModel"]
