"""Shared fixtures. Real-model fixtures are session-scoped: each embedded model loads once per run."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm():
    """The default embedded model (instruction-tuned SmolLM2-135M), loaded once."""
    from gnll import load_model

    return load_model("smollm2-135m-instruct", progress=False)


@pytest.fixture(scope="session")
def gemma():
    """The embedded pre-trained Gemma-3-270M, loaded once."""
    from gnll import load_model

    return load_model("gemma-3-270m", progress=False)
