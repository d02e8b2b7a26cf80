"""``--model_args`` on a Ray driver: the hf backend's keys are typed from its declaration
(:class:`gnll.backends.model_args.HFModelArgs`), so the backend (torch and transformers) is not
imported where no model runs, given ``--model_args`` or not. The whole driver:
tests/distributed/test_distributed.py::test_a_ray_driver_given_model_args_imports_no_model_library."""

from __future__ import annotations

import pytest
import typer

import gnll.backends.registry as registry
from gnll.backends.identity import model_identity
from gnll.cli._args import model_kwargs


def test_model_args_are_typed_without_importing_the_hf_backend(monkeypatch):
    def imported(name):
        raise AssertionError(f"the {name} backend was imported to type --model_args")

    monkeypatch.setattr(registry, "get_backend", imported)
    monkeypatch.delitem(registry.BACKENDS, "hf", raising=False)
    assert model_kwargs(None) == {}
    assert model_kwargs("") == {}
    typed = model_kwargs("revision=main,batch_size=8,decoder=loop,chat_template=none")
    assert typed == {"revision": "main", "batch_size": 8, "decoder": "loop", "chat_template": None}
    with pytest.raises(typer.BadParameter, match="unknown key 'dtyp' for backend=hf"):
        model_kwargs("dtyp=float32")
    # the run's fingerprint identifies the model without the backend too
    assert model_identity("smollm2-135m-instruct", typed)["kind"] == "embedded"


@pytest.mark.e2e  # a subprocess: nothing imported by this test session can hide an import
def test_a_fresh_process_types_model_args_and_fingerprints_without_torch(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from gnll.cli._args import model_kwargs\n"
        "from gnll.backends.identity import model_identity\n"
        "from gnll.evaluation.results.report import versions\n"
        f"args = model_kwargs('dtype=float32,batch_size=8', model={str(tmp_path)!r})\n"
        f"model_identity({str(tmp_path)!r}, args), versions()\n"
        "print(sorted(m for m in ('gnll.backends.hf', 'torch', 'transformers') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[]"
