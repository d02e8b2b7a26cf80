"""Repository-wide pytest hooks (the fixtures live in tests/conftest.py, the tiers in tests/tiers.py)."""

from __future__ import annotations

import pytest

# The tier markers' guard (tests/ is on the path: pyproject's pythonpath), for src/gnll's doctests too.
pytest_plugins = ["tiers"]

# The framework integrations import their framework (an optional extra) when imported: their doctest
# collection would put LangChain & co. into the fast tier. tests/integrations tests them.
collect_ignore_glob = [
    "src/gnll/integrations/langchain.py",
    "src/gnll/integrations/litellm.py",
    "src/gnll/integrations/dspy.py",
    "src/gnll/integrations/llamaindex.py",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Docstring examples that load a real model get the ``model`` marker, like the tests that do,
    so the fast tier leaves them out and the full suite still runs them."""
    for item in items:
        if isinstance(item, pytest.DoctestItem) and any(
            "load_model(" in example.source for example in item.dtest.examples
        ):
            item.add_marker(pytest.mark.model)
