"""Repository-wide pytest hooks (the fixtures live in tests/conftest.py)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Docstring examples that load a real model get the ``model`` marker, like the tests that do,
    so ``-m "not model"`` is the fast suite and the full suite still runs them."""
    for item in items:
        if isinstance(item, pytest.DoctestItem) and any(
            "load_model(" in example.source for example in item.dtest.examples
        ):
            item.add_marker(pytest.mark.model)
