"""Fixtures of the evaluation tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import make_data_dir


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """The fake model's TriviaQA and SVAMP files (:func:`fakes.make_data_dir`), one per module."""
    return make_data_dir(tmp_path_factory.mktemp("data"))
