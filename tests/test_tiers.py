"""The tier guard (tests/tiers.py): a test that pays a cost its markers do not name fails.

Each case runs a small test file in an inner pytest session with the guard loaded, in this process
(``runpytest_inprocess``), and reads the outcome.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = textwrap.dedent(
    """
    import pytest

    pytest_plugins = ["tiers"]


    @pytest.fixture(scope="session")
    def smollm():
        return "not a model: only the fixture's name counts"


    @pytest.fixture(scope="session")
    def vllm_server():
        return "not a server: only the fixture's name counts"
    """
)


@pytest.fixture(scope="session")
def transformers_imported() -> None:
    """transformers, imported before pytester snapshots ``sys.modules``: the snapshot drops what
    an inner run imports, and torch cannot be imported twice in one process."""
    import transformers.modeling_utils  # noqa: F401


@pytest.fixture(scope="session")
def checkpoint_elsewhere(tmp_path_factory) -> Iterator[str]:
    """A checkpoint directory outside pytest's temporary directory (a config, no weights), like a
    hub checkpoint in a cache: transformers reads the config, then the guard stops the weights."""
    from transformers import LlamaConfig

    path = tempfile.mkdtemp(prefix="gnll-tiers-")
    LlamaConfig(
        vocab_size=16,
        hidden_size=8,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
    ).save_pretrained(path)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def run(transformers_imported, pytester: pytest.Pytester):
    """Run ``source`` as an inner test file; return its outcomes and its output."""
    pytester.makeconftest(CONFTEST)
    pytester.makeini(
        "[pytest]\nmarkers =\n    model: m\n    server: s\n    vllm: v\n    browser: b\n    e2e: e\n"
    )

    def run(source: str) -> tuple[dict[str, int], str]:
        pytester.makepyfile(test_inner=textwrap.dedent(source))
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
        return result.parseoutcomes(), result.stdout.str()

    return run


def test_an_unmarked_test_that_loads_weights_fails(run, checkpoint_elsewhere):
    outcomes, out = run(
        f"""
        from transformers import AutoModelForCausalLM

        def test_loads():
            AutoModelForCausalLM.from_pretrained({checkpoint_elsewhere!r})
        """
    )
    assert outcomes == {"failed": 1}, out
    assert f"loads model weights from {checkpoint_elsewhere}" in out
    assert "not marked @pytest.mark.model" in out


def test_a_test_marked_model_may_load_weights(run, checkpoint_elsewhere):
    outcomes, out = run(
        f"""
        import pytest
        from transformers import AutoModelForCausalLM

        @pytest.mark.model
        def test_loads():
            with pytest.raises(OSError, match="no file named"):
                AutoModelForCausalLM.from_pretrained({checkpoint_elsewhere!r})  # no weights saved
        """
    )
    assert outcomes == {"passed": 1}, out


def test_a_tiny_checkpoint_saved_under_pytests_temporary_directory_is_allowed(run):
    outcomes, out = run(
        """
        from transformers import LlamaConfig, LlamaForCausalLM

        def test_tiny(tmp_path):
            config = LlamaConfig(
                vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1,
            )
            LlamaForCausalLM(config).save_pretrained(tmp_path)
            assert LlamaForCausalLM.from_pretrained(tmp_path).config.vocab_size == 16
        """
    )
    assert outcomes == {"passed": 1}, out


def test_a_swallowed_or_threaded_load_still_fails_the_test(run, checkpoint_elsewhere):
    outcomes, out = run(
        f"""
        import threading
        from transformers import AutoModelForCausalLM

        def load():
            try:
                AutoModelForCausalLM.from_pretrained({checkpoint_elsewhere!r})
            except BaseException:
                pass  # a server's worker thread that logs and carries on

        def test_loads_in_a_thread():
            t = threading.Thread(target=load)
            t.start()
            t.join()
        """
    )
    assert outcomes == {"failed": 1}, out
    assert f"loads model weights from {checkpoint_elsewhere}" in out


def test_reaching_an_embedded_model_needs_the_model_marker(run):
    outcomes, out = run(
        """
        from gnll.backends.registry import EMBEDDED_MODELS, embedded_model_dir

        def test_tokenizer_only():
            embedded_model_dir(EMBEDDED_MODELS["smollm2-135m-instruct"])
        """
    )
    assert outcomes == {"failed": 1}
    assert "reaches the embedded model 'smollm2-135m-instruct'" in out


def test_requesting_a_real_model_fixture_needs_the_model_marker(run):
    outcomes, out = run(
        """
        import pytest

        def test_unmarked(smollm):
            pass

        @pytest.mark.model
        def test_marked(smollm):
            pass
        """
    )
    assert outcomes == {"passed": 1, "errors": 1}, out
    assert "test_unmarked requests the real-model fixture 'smollm'" in out


def test_the_vllm_server_fixture_needs_the_vllm_marker(run):
    """The run's real vLLM server costs minutes to start: only the vllm tier may ask for it (the
    server or model markers are not enough)."""
    outcomes, out = run(
        """
        import pytest

        @pytest.mark.server
        @pytest.mark.model
        def test_unmarked(vllm_server):
            pass

        @pytest.mark.vllm
        def test_marked(vllm_server):
            pass
        """
    )
    assert outcomes == {"passed": 1, "errors": 1}, out
    assert "test_unmarked requests the real vLLM server fixture 'vllm_server'" in out
    assert "not marked @pytest.mark.vllm" in out


def test_starting_a_python_process_needs_a_process_marker(run):
    outcomes, out = run(
        f"""
        import subprocess
        import pytest

        def test_unmarked():
            subprocess.run([{sys.executable!r}, "-c", "pass"], check=True)

        @pytest.mark.e2e
        def test_e2e():
            subprocess.run([{sys.executable!r}, "-c", "pass"], check=True)

        def test_a_cheap_program_is_fine():
            subprocess.run(["true"], check=True)
        """
    )
    assert outcomes == {"passed": 2, "failed": 1}, out
    assert "test_unmarked starts a python" in out and "not marked @pytest.mark.e2e" in out


@pytest.mark.e2e
def test_transformers_imported_during_a_test_is_guarded_too(
    pytester: pytest.Pytester, checkpoint_elsewhere, monkeypatch
):
    """The guard patches transformers when it is first imported (the fast tier need not import it
    up front): a fresh interpreter, transformers imported inside the test."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_inner=f"""
        import sys

        def test_loads():
            assert "transformers.modeling_utils" not in sys.modules
            from transformers import AutoModelForCausalLM
            AutoModelForCausalLM.from_pretrained({checkpoint_elsewhere!r})
        """
    )
    path = [str(Path(__file__).parent), *sys.path]  # tiers, and gnll as this process finds it
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in path if p))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    assert result.parseoutcomes() == {"failed": 1}
    assert "not marked @pytest.mark.model" in result.stdout.str()


def test_an_unmarked_test_that_imports_a_framework_fails():
    """What the import guard does when this (unmarked) test is the first to import a framework of
    gnll.integrations; the fast tier never collects their tests (tests/integrations/conftest.py)."""
    import types

    import tiers

    assert tiers.GUARDED_MODULES["dspy"] is tiers._guard_framework
    with pytest.raises(tiers.TierViolation, match=r"imports the framework 'dspy'.*integration"):
        tiers._guard_framework(types.ModuleType("dspy"))
    tiers._now().violations.clear()  # the guard's own check, not this test's cost
