"""The framework tests import their framework at collection: a run whose marker expression cannot
select them (the fast tier) does not collect them, so the fast tier never imports LangChain & co."""

from __future__ import annotations

from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

FRAMEWORK_TESTS = {"test_langchain.py", "test_litellm.py", "test_dspy.py", "test_llamaindex.py"}
# the markers those tests carry (every one has integration and server; some model, e2e)
POSSIBLE = [
    {"integration", "server"},
    {"integration", "server", "model"},
    {"integration", "server", "e2e"},
    {"integration", "server", "model", "e2e"},
]


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    expr = config.getoption("markexpr")
    if collection_path.name not in FRAMEWORK_TESTS or not expr:
        return None
    compiled = Expression.compile(expr)
    if any(compiled.evaluate(lambda name, /, marks=m, **kw: name in marks) for m in POSSIBLE):
        return None
    return True


@pytest.fixture(scope="module")
def served(smollm):
    """``gnll serve`` in-process around the session's SmolLM2 (``srv.url``; ``srv.client``: the
    official openai client): the reference every framework's numbers are checked against."""
    import openai

    from gnll.serving import ServeSettings, build_inprocess_app
    from gnll.serving.server import ServerThread

    with ServerThread(build_inprocess_app(smollm, ServeSettings(), max_wait_ms=1)) as srv:
        srv.client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0)
        yield srv
