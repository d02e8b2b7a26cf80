"""`import gnll` imports neither gnll.integrations nor any framework (they are optional extras)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

FRAMEWORKS = ("gnll.integrations", "langchain", "litellm", "dspy", "llama_index")


def test_import_gnll_imports_no_framework():
    code = (
        "import sys, gnll, gnll.serving, gnll.scoring; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r} "
        f"or m.startswith('gnll.integrations')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
