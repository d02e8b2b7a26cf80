"""The backend registry: ``load_model(name, backend=...)`` and ``@register_backend``.

Backends register a factory under a name, as lm-evaluation-harness registers its models. The two
built-in ones register themselves when their package is imported; :func:`load_model` imports that
package the first time its name is asked for, so ``import gnll`` does not load torch or httpx::

    @register_backend("mine")
    def load_mine(name: str, *, progress: bool = True, **model_args) -> Model: ...
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gnll.backends.base import Model
from gnll.backends.embedded import (  # the catalogue, re-exported where callers import it from
    DEFAULT_MODEL,
    EMBEDDED_MODELS,
    EmbeddedModel,
    embedded_model_dir,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_MODEL",
    "EMBEDDED_MODELS",
    "Backend",
    "EmbeddedModel",
    "available_backends",
    "check_model",
    "declared",
    "embedded_model_dir",
    "get_backend",
    "load_model",
    "register_backend",
]

#: A factory: ``factory(name, *, progress, **model_args) -> Model``.
Factory = Callable[..., Model]


@dataclass(frozen=True)
class Backend:
    """A registered backend.

    Attributes
    ----------
    name:
        What ``load_model(..., backend=name)`` and ``--model_args backend=name`` select.
    factory:
        ``factory(name, *, progress, **model_args) -> Model``.
    requires:
        ``model_args`` that must be given, with an example value each (checked before loading).
    targets:
        Callables whose keyword parameters are this backend's ``model_args`` (the CLI types
        ``--model_args`` values from their annotations).
    identity:
        ``identity(name, model_args) -> dict``: what identifies the model without loading it
        (what a run's resume fingerprint records; see :mod:`gnll.backends.identity`). ``None``:
        the backend's and the model's names.
    tokenizer_side:
        ``tokenizer_side(model, **kwargs)``: how the backend renders, tokenises and ends answers,
        for an engine that runs the weights itself (see :func:`gnll.backends.tokenizer_side`).
        ``None``: the backend has none to lend.
    model_args:
        A ``TypedDict`` of the keys and types this backend's ``model_args`` take, declared where
        reading it imports nothing heavy (:func:`declared`). ``None``: its
        :attr:`targets`' parameters say.
    """

    name: str
    factory: Factory
    requires: dict[str, str]
    targets: tuple[Callable[..., Any], ...]
    identity: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None
    tokenizer_side: Callable[..., Any] | None = None
    model_args: type | None = None


#: Registered backends by name.
BACKENDS: dict[str, Backend] = {}

#: Built-in backends and the package whose import registers each.
_BUILTIN = {"hf": "gnll.backends.hf", "openai": "gnll.backends.openai"}

#: What a built-in backend declares apart from its package (``module:name`` per :class:`Backend`
#: field), so that a process that loads no model (a Ray driver) reads it without importing the
#: backend: the hf backend's import is torch's. The backend registers the same objects.
_DECLARED = {
    "hf": {
        "model_args": "gnll.backends.model_args:HFModelArgs",
        "identity": "gnll.backends.identity:local_identity",
    },
}


def register_backend(
    name: str,
    *,
    requires: dict[str, str] | None = None,
    targets: Sequence[Callable[..., Any]] = (),
    identity: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
    tokenizer_side: Callable[..., Any] | None = None,
    model_args: type | None = None,
) -> Callable[[Factory], Factory]:
    """Register ``factory`` as backend ``name`` (a decorator); see :class:`Backend`.

    >>> @register_backend("doc-example")
    ... def load_example(name, *, progress=True, **model_args):
    ...     raise NotImplementedError
    >>> "doc-example" in available_backends()
    True
    >>> del BACKENDS["doc-example"]
    """

    def decorate(factory: Factory) -> Factory:
        old = BACKENDS.get(name)
        if old is not None and old.factory is not factory:
            raise ValueError(f"backend {name!r} is already registered (by {old.factory!r})")
        BACKENDS[name] = Backend(
            name,
            factory,
            dict(requires or {}),
            (factory, *targets),
            identity,
            tokenizer_side,
            model_args,
        )
        return factory

    return decorate


def available_backends() -> list[str]:
    """Names ``load_model`` accepts: the registered and the built-in ones."""
    return sorted(set(BACKENDS) | set(_BUILTIN))


def declared(name: str, field: Literal["model_args", "identity"]) -> Any:
    """Backend ``name``'s ``field`` (see :class:`Backend`), read without importing a built-in
    backend that declares it apart from its package (:func:`get_backend` otherwise).

    >>> sorted(declared("hf", "model_args").__annotations__)[:3]
    ['batch_size', 'beam_decoder', 'chat_template']
    >>> declared("hf", "identity").__name__
    'local_identity'
    """
    ref = _DECLARED.get(name, {}).get(field)
    if name not in BACKENDS and ref is not None:
        module, _, attr = ref.partition(":")
        return getattr(importlib.import_module(module), attr)
    return getattr(get_backend(name), field)


def get_backend(name: str) -> Backend:
    """The registered backend ``name``, importing a built-in one on first use."""
    if name not in BACKENDS and name in _BUILTIN:
        importlib.import_module(_BUILTIN[name])
    if name not in BACKENDS:
        choices = ", ".join(repr(b) for b in available_backends())
        raise ValueError(f"unknown backend {name!r}; available: {choices}")
    return BACKENDS[name]


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    backend: str = "hf",
    progress: bool = True,
    reasoning: str | None = None,
    trace_budget: int | None = None,
    **model_args: Any,
) -> Model:
    """Load a model by name.

    Parameters
    ----------
    name:
        An embedded model (``smollm2-135m-instruct``, ``gemma-3-270m``), a Hugging Face hub id
        (``meta-llama/Llama-3.1-8B-Instruct``) or a local checkpoint directory.
    backend:
        ``"hf"`` (transformers, in-process), ``"openai"`` (an OpenAI-compatible server such as
        vLLM or llama.cpp; needs ``base_url``) or any name registered with :func:`register_backend`.
    progress:
        Show a spinner while loading/converting.
    **model_args:
        Passed to the backend. For ``"hf"``: :meth:`gnll.backends.hf.HFModel.from_pretrained`'s
        ``device`` (auto/cpu/cuda), ``dtype`` (auto/float32/bfloat16/float16), ``revision``,
        ``trust_remote_code``, ``gguf_file``, and :class:`~gnll.backends.hf.HFModel`'s
        ``chat_template`` (bool; default: on for instruction-tuned models), ``batch_size``,
        ``max_batch_tokens``, ``decoder`` (auto/loop/generate). For any backend, ``reasoning``
        (``think``, ``harmony`` or ``marker:TEXT``) says the model reasons before it answers: an
        in-process model decodes a greedy trace (at most ``trace_budget`` tokens) and then the
        answer (:class:`~gnll.backends.reasoning_model.ReasoningModel`); a server's responses
        are split at the marker (servers with a reasoning parser are recognised without it).
        Either way every measure sees the answer's tokens only.

    Returns
    -------
    Model

    Examples
    --------
    >>> model = load_model("smollm2-135m-instruct", progress=False)
    >>> [[answer]] = model.generate(["What is the capital of France?"])
    >>> "Paris" in answer.text, answer.finish_reason in ("stop", "eos", "length")
    (True, True)
    """
    check_model(name, backend=backend, reasoning=reasoning, trace_budget=trace_budget, **model_args)
    factory = get_backend(backend).factory
    if reasoning is None:
        return factory(name, progress=progress, **model_args)
    if backend == "openai":  # the server decodes the trace; its responses are split
        return factory(name, progress=progress, reasoning=reasoning, **model_args)
    from gnll.backends.reasoning_model import ReasoningModel

    model = factory(name, progress=progress, **model_args)
    return ReasoningModel(
        model, reasoning, trace_budget=256 if trace_budget is None else trace_budget
    )


def check_model(
    name: str = DEFAULT_MODEL,
    *,
    backend: str = "hf",
    reasoning: str | None = None,
    trace_budget: int | None = None,
    **model_args: Any,
) -> None:
    """Refuse, in about a second and without loading anything, a model :func:`load_model` cannot
    load: an unknown backend, a backend's missing argument, an hf model that is neither embedded,
    a local path, in the hub cache nor on the hub
    (:class:`~gnll.backends.resolve.ModelNotFound`). Run it before creating files for a model.

    >>> check_model("smollm2-135m-instruct")
    >>> check_model("m", backend="openai")
    Traceback (most recent call last):
    ValueError: backend='openai' needs base_url=http://HOST:PORT/v1
    """
    if backend == "hf" and name not in EMBEDDED_MODELS:
        from gnll.backends.resolve import check_model_source

        # Before the backend's import (torch): a typo is refused in a second, not a minute.
        check_model_source(
            name, revision=model_args.get("revision"), gguf_file=model_args.get("gguf_file")
        )
    spec = get_backend(backend)
    missing = [k for k in spec.requires if k not in model_args]
    if missing:
        needs = " ".join(f"{k}={spec.requires[k]}" for k in missing)
        raise ValueError(f"backend={backend!r} needs {needs}")
    if trace_budget is not None and reasoning is None:
        raise ValueError("trace_budget needs reasoning=think|harmony|marker:TEXT")
    if reasoning is not None:
        from gnll.backends.reasoning import reasoning_format

        reasoning_format(reasoning)  # a typo fails before anything loads
        if backend == "openai" and trace_budget is not None:
            raise ValueError("trace_budget is for in-process models: a server decodes the trace")
