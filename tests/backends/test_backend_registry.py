"""The backend registry: built-in backends register themselves, others plug in by name."""

from __future__ import annotations

import pytest

from gnll import load_model
from gnll.backends.base import Capabilities, Generation, Model
from gnll.backends.registry import BACKENDS, available_backends, get_backend, register_backend


class _Echo(Model):
    capabilities = Capabilities(beams=False, scoring=False)

    def __init__(self, name: str, **options):
        self.name, self.options = name, options

    def generate(self, prompts, config=None, *, batch_size=None, progress=False):
        return [[Generation(p, [1], ["x"], [-0.5], "eos")] for p in prompts]

    def score(self, prompts, answers, *, raw_prompt=False, batch_size=None, progress=False):
        raise NotImplementedError

    def render_prompt(self, prompt):
        return prompt


def test_a_registered_backend_is_loaded_by_name():
    @register_backend("echo-test", requires={"level": "3"})
    def load_echo(name, *, progress=True, **model_args):
        return _Echo(name, **model_args)

    try:
        assert "echo-test" in available_backends()
        model = load_model("m", backend="echo-test", level=3)
        assert isinstance(model, _Echo) and model.options == {"level": 3}
        with pytest.raises(ValueError, match="backend='echo-test' needs level=3"):
            load_model("m", backend="echo-test")
        register_backend("echo-test")(load_echo)  # the same factory again: a no-op
        with pytest.raises(ValueError, match="already registered"):
            register_backend("echo-test")(lambda name, **kw: _Echo(name))
    finally:
        BACKENDS.pop("echo-test", None)


def test_builtin_backends_register_on_first_use():
    assert {"hf", "openai"} <= set(available_backends())
    openai = get_backend("openai")
    assert openai.requires == {"base_url": "http://HOST:PORT/v1"}
    with pytest.raises(ValueError, match="backend='openai' needs base_url="):
        load_model("some-model", backend="openai")
    with pytest.raises(ValueError, match="unknown backend 'nope'; available: .*'hf'.*'openai'"):
        load_model("x", backend="nope")


def test_model_args_are_typed_by_the_backend_parameters():
    from gnll.cli._args import model_kwargs

    hf = model_kwargs("batch_size=8,decoder=generate,max_batch_tokens=none")
    assert hf == {"batch_size": 8, "decoder": "generate", "max_batch_tokens": None}
    server = model_kwargs("backend=openai,base_url=http://127.0.0.1:1/v1,concurrency=4")
    assert server["concurrency"] == 4


def test_the_hf_backend_takes_exactly_the_model_args_it_declares():
    """``HFModelArgs`` (read without importing the backend, by the CLI) and the hf loader's and
    model's keyword parameters are the same keys with the same types, and the backend registers
    what the registry declares for it."""
    import inspect
    import typing

    from gnll.backends.hf import HFModel
    from gnll.backends.identity import local_identity
    from gnll.backends.model_args import HFModelArgs
    from gnll.backends.registry import declared
    from gnll.cli._args import _NOT_MODEL_ARGS

    params = {}
    for fn in (HFModel.from_pretrained, HFModel.__init__):
        hints = typing.get_type_hints(fn)
        for name, p in inspect.signature(fn).parameters.items():
            if p.kind is p.KEYWORD_ONLY and name not in _NOT_MODEL_ARGS:
                params[name] = hints[name]
    assert params == typing.get_type_hints(HFModelArgs)
    hf = get_backend("hf")
    assert hf.model_args is HFModelArgs is declared("hf", "model_args")
    assert hf.identity is local_identity is declared("hf", "identity")
