"""Test tiers: markers that name what a test costs, and a guard that fails a test costing more
than its markers say.

=========  ==================================================================================
marker     the test ...
=========  ==================================================================================
model      loads real model weights in the test process (the embedded models, MiniLM, ...)
server     starts a server process (llama.cpp's server, ``gnll serve``)
vllm       uses the run's real vLLM server (``vllm_server``: vLLM's CPU build on the embedded
           SmolLM2, started once per run from its own venv, tests/vllm_helpers.py)
browser    drives a headless browser (Chromium through Playwright)
e2e        runs gnll or Python in a subprocess (CLI runs, bench scripts, kill -9 and resume)
integr...  imports a framework of gnll.integrations (LangChain, LiteLLM, DSPy, LlamaIndex);
           the marker is ``integration``
=========  ==================================================================================

The fast tier is every test without one of these markers (``-m "not (model or server or vllm or
browser or e2e or integration)"``, what ``scripts/test.sh --fast`` runs). It may build tiny random-weight models in
memory or under pytest's temporary directory, but never loads a real checkpoint and never starts
a process. The guard holds every test to that: during a test without ``model``, loading weights
through transformers (other than a checkpoint the test saved under pytest's temporary directory),
reaching an embedded model's checkpoint or requesting a real-model fixture fails the test; during a
test without ``server``, ``browser`` or ``e2e``, starting a Python, gnll, llama.cpp, node or browser
process fails it.

Loaded as a plugin by the repository's root ``conftest.py`` (so it also covers the doctests).
"""

from __future__ import annotations

import functools
import importlib.abc
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TIERS = ("model", "server", "vllm", "browser", "e2e", "integration")  # registered in pyproject.toml

# Session fixtures (tests/conftest.py) that hold real loaded models: requesting one is loading
# weights, even when an earlier test of the session already paid for it.
WEIGHT_FIXTURES = frozenset(
    {
        "smollm",
        "gemma",
        "smollm_generate",
        "gemma_generate",
        "smollm_generate_beams",
        "gemma_generate_beams",
    }
)
# Session fixtures that start (or share) a real vLLM server: requesting one needs the vllm marker.
VLLM_FIXTURES = frozenset({"vllm_server", "vllm_processed_server"})
# Programs whose start costs seconds (an interpreter with torch, a server, a browser).
HEAVY_PROGRAMS = ("python", "gnll", "llama", "node", "chrom", "playwright", "uvicorn")


class _Session:
    """What the guard knows of the running test: its tier markers (None outside any test:
    collection, the end of the session, where nothing is checked), its id, pytest's temporary
    directory, and what it paid for unmarked. One per pytest session; an inner session (the
    guard's own tests run one) stacks its own."""

    def __init__(self) -> None:
        self.marks: set[str] | None = None
        self.name = ""
        self.basetemp: Path | None = None
        self.violations: list[str] = []


_sessions = [_Session()]


def _now() -> _Session:
    return _sessions[-1]


class TierViolation(pytest.fail.Exception):  # type: ignore[name-defined,misc]
    """Raised where an unmarked test pays a cost; a BaseException, so no ``except Exception``
    in the code under test swallows it."""


def _violation(what: str, marker: str) -> None:
    message = (
        f"{_now().name} {what}, but is not marked @pytest.mark.{marker} "
        f"(tests/tiers.py: the fast tier loads no weights and starts no processes)"
    )
    _now().violations.append(message)
    raise TierViolation(message, pytrace=False)


def _needs(*markers: str) -> str | None:
    """The marker a cost needs if the running test has none of ``markers``; None if allowed."""
    marks = _now().marks
    if marks is None or marks.intersection(markers):
        return None
    return markers[0]


def _under_basetemp(source: Any) -> bool:
    basetemp = _now().basetemp
    if basetemp is None or not isinstance(source, (str, os.PathLike)):
        return False
    try:
        return Path(source).resolve().is_relative_to(basetemp)
    except (OSError, ValueError):
        return False


def _guard_from_pretrained(module: Any) -> None:
    """transformers' ``PreTrainedModel.from_pretrained``: every weight load of every model class
    (``AutoModel*``, sentence-transformers, GGUF conversion) passes through it."""
    cls = module.PreTrainedModel
    original = cls.__dict__["from_pretrained"].__func__
    if getattr(original, "_tier_guard", False):
        return

    @functools.wraps(original)
    def from_pretrained(klass: type, *args: Any, **kwargs: Any) -> Any:
        source = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        marker = _needs("model")
        if marker and not _under_basetemp(source):
            _violation(f"loads model weights from {source!s}", marker)
        return original(klass, *args, **kwargs)

    from_pretrained._tier_guard = True  # type: ignore[attr-defined]
    cls.from_pretrained = classmethod(from_pretrained)


def _guard_embedded(module: Any) -> None:
    """``gnll.backends.embedded.embedded_model_dir``: an embedded model's converted checkpoint
    (converting it from GGUF on a cold cache), even when only its tokenizer is wanted."""
    original = module.embedded_model_dir
    if getattr(original, "_tier_guard", False):
        return

    @functools.wraps(original)
    def embedded_model_dir(spec: Any, *args: Any, **kwargs: Any) -> Path:
        marker = _needs("model", "vllm")  # the vllm tier's server is started on it
        if marker:
            _violation(f"reaches the embedded model {getattr(spec, 'name', spec)!r}", marker)
        return original(spec, *args, **kwargs)

    embedded_model_dir._tier_guard = True  # type: ignore[attr-defined]
    module.embedded_model_dir = embedded_model_dir


def _guard_framework(module: Any) -> None:
    """A framework of gnll.integrations (an optional extra) imported by a test without the
    ``integration`` marker: the fast tier stays free of them."""
    marker = _needs("integration")
    if marker:
        _violation(f"imports the framework {module.__name__!r}", marker)


GUARDED_MODULES: dict[str, Callable[[Any], None]] = {
    "transformers.modeling_utils": _guard_from_pretrained,
    "gnll.backends.embedded": _guard_embedded,
    "langchain_core": _guard_framework,
    "litellm": _guard_framework,
    "dspy": _guard_framework,
    "llama_index.core": _guard_framework,
}


class _GuardOnImport(importlib.abc.MetaPathFinder):
    """Guard a module the moment it is imported, so that the fast tier need not import torch and
    transformers up front just to patch them."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in GUARDED_MODULES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_guard(module: Any) -> None:
            exec_module(module)
            GUARDED_MODULES[name](module)

        loader.exec_module = exec_and_guard  # type: ignore[method-assign]
        return spec


def _program(args: Any, executable: Any) -> str:
    if executable:
        return os.path.basename(os.fsdecode(executable))
    if isinstance(args, (str, bytes, os.PathLike)):
        first = os.fsdecode(args).split()[0] if os.fsdecode(args).strip() else ""
    else:
        args = list(args)
        first = os.fsdecode(args[0]) if args else ""
    return os.path.basename(first)


_popen_init = subprocess.Popen.__init__


def _guarded_popen_init(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
    program = _program(args, kwargs.get("executable"))
    marker = _needs("e2e", "server", "browser", "vllm")
    if marker and (
        program == os.path.basename(sys.executable) or program.lower().startswith(HEAVY_PROGRAMS)
    ):
        _violation(f"starts a {program} process", marker)
    _popen_init(self, args, *rest, **kwargs)


def install() -> None:
    """Guard the loaders (those already imported now, the others when they are imported)."""
    for name, guard in GUARDED_MODULES.items():
        if name in sys.modules:
            guard(sys.modules[name])
    if not any(isinstance(f, _GuardOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _GuardOnImport())
    subprocess.Popen.__init__ = _guarded_popen_init  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    _sessions.append(_Session())
    install()


def pytest_unconfigure(config: pytest.Config) -> None:
    if len(_sessions) > 1:
        _sessions.pop()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    now = _now()
    factory = getattr(item.config, "_tmp_path_factory", None)
    now.marks = {m.name for m in item.iter_markers()}.intersection(TIERS)
    now.name = item.nodeid
    now.basetemp = factory.getbasetemp().resolve() if factory is not None else None
    now.violations = []
    result = yield
    # Checked once the fixtures are set up (raising earlier would skip pytest's own setup): a
    # first load was already stopped by the loaders' guards, this catches a cached model.
    if "model" not in now.marks:
        wanted = sorted(WEIGHT_FIXTURES.intersection(getattr(item, "fixturenames", ())))
        if wanted:
            _violation(f"requests the real-model fixture {wanted[0]!r}", "model")
    if "vllm" not in now.marks:
        wanted = sorted(VLLM_FIXTURES.intersection(getattr(item, "fixturenames", ())))
        if wanted:
            _violation(f"requests the real vLLM server fixture {wanted[0]!r}", "vllm")
    return result


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    result = yield
    # A load in another thread (a server's worker) raises there, not in the test: fail it here.
    if _now().violations:
        raise TierViolation(_now().violations[0], pytrace=False)
    return result


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    try:
        return (yield)
    finally:
        _now().marks = None
