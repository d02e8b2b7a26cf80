"""``--model_args`` on a Ray driver: with none given, nothing is typed, so the backend (torch and
transformers for hf) is not imported where no model runs."""

from __future__ import annotations

import pytest

import gnll.backends.registry as registry
from gnll.cli._args import model_kwargs


def test_no_model_args_imports_no_backend(monkeypatch):
    def imported(name):
        raise AssertionError(f"the {name} backend was imported to type no --model_args")

    monkeypatch.setattr(registry, "get_backend", imported)
    assert model_kwargs(None) == {}
    assert model_kwargs("") == {}
    with pytest.raises(AssertionError, match="hf backend was imported"):
        model_kwargs("revision=main")  # given ones are typed by the backend's parameters
