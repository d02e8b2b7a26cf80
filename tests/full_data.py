"""The full dataset files, for the few tests that are about them (loading, counts, the embedded sample
being their split). Every other test runs on the sample shipped with gnll.

CI points ``GNLL_TEST_FULL_DATA`` at a folder holding the three files (``.ci/run``); elsewhere these
tests skip and say why.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gnll.evaluation.data.datasets import DATASETS


def _full_data() -> Path | None:
    d = os.environ.get("GNLL_TEST_FULL_DATA")
    if d and all((Path(d) / spec.relpath).is_file() for spec in DATASETS.values()):
        return Path(d)
    return None


FULL_DATA = _full_data()
needs_full_data = pytest.mark.skipif(
    FULL_DATA is None,
    reason="the full dataset files are not here: set GNLL_TEST_FULL_DATA to their folder (CI does)",
)
