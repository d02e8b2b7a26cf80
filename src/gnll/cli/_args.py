"""The one parser of the CLI's ``key=value,...`` and comma-separated options.

Values stay the strings the user typed (an API key ``1e3`` is not the number 1000.0) until the
parameter that receives them says otherwise: :func:`typed_kwargs` converts a value only to the type
annotated on the receiving function's parameter of that name (``batch_size: int`` -> ``8``,
``chat_template: bool | None`` -> ``False``), and leaves every other value a string.

Examples
--------
>>> parse_kv("device=cpu, batch_size=8,api_key=1e3")
{'device': 'cpu', 'batch_size': '8', 'api_key': '1e3'}
>>> def load(name: str, *, batch_size: int = 1, api_key: str | None = None): ...
>>> typed_kwargs({"batch_size": "8", "api_key": "1e3"}, load)
{'batch_size': 8, 'api_key': '1e3'}
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import typer

__all__ = [
    "clusterer_kwargs",
    "coerce",
    "model_arg_keys",
    "model_kwargs",
    "parse_csv",
    "parse_kv",
    "parse_list",
    "typed_kwargs",
]

_TRUE = ("true", "yes", "1", "on")
_FALSE = ("false", "no", "0", "off")
_NONE = ("none", "null")


def parse_kv(spec: str | None, option: str = "--model_args") -> dict[str, str]:
    """``"a=1,b=x"`` -> ``{"a": "1", "b": "x"}`` (values verbatim; empty items are skipped).

    A malformed item raises :class:`typer.BadParameter` naming ``option``.
    """
    if not spec:
        return {}
    out: dict[str, str] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(
                f"expected key=value pairs separated by commas, got {part!r}", param_hint=option
            )
        out[key.strip()] = value.strip()
    return out


def parse_csv(value: str | None) -> list[str] | None:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``; ``None`` (or nothing but commas) -> ``None``."""
    if value is None:
        return None
    items = [x.strip() for x in value.split(",") if x.strip()]
    return items or None


def parse_list(value: str | None, cast: Any, option: str) -> tuple[Any, ...] | None:
    """``"1, 2,3"`` -> ``(1, 2, 3)`` with every item converted to ``cast`` (see :func:`coerce`).

    ``None`` stays ``None``; an empty list or an item of the wrong type raises
    :class:`typer.BadParameter` naming ``option``.
    """
    if value is None:
        return None
    items = parse_csv(value)
    if not items:
        raise typer.BadParameter("empty list", param_hint=option)
    try:
        return tuple(coerce(x, cast) for x in items)
    except ValueError as exc:
        raise typer.BadParameter(f"{exc} (a comma-separated list)", param_hint=option) from None


def coerce(value: str, annotation: Any) -> Any:
    """Convert ``value`` to ``annotation`` (bool, int, float, str, Literal, unions and Optional).

    An annotation it does not know (``Any``, a class) keeps the string. A value that fits none of the
    allowed types raises ``ValueError``.

    >>> coerce("none", int | None) is None, coerce("8", int), coerce("1e3", float)
    (True, 8, 1000.0)
    >>> coerce("off", bool)
    False
    """
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        options = typing.get_args(annotation)
        # None, then bools, then numbers, then strings: "none" is None for `int | None`, and "true"
        # is True for `bool | str`.
        rank = {type(None): 0, bool: 1, int: 2, float: 3}
        errors = []
        for opt in sorted(options, key=lambda o: rank.get(o, 4)):
            try:
                return coerce(value, opt)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError(" or ".join(errors))
    if origin is typing.Literal:
        choices = typing.get_args(annotation)
        for choice in choices:
            if value == str(choice):
                return choice
        raise ValueError(f"expected one of {', '.join(map(str, choices))}, got {value!r}")
    if annotation is type(None):
        if value.lower() in _NONE:
            return None
        raise ValueError(f"expected none, got {value!r}")
    if annotation is bool:
        low = value.lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        raise ValueError(f"expected true or false, got {value!r}")
    if annotation is int:
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"expected an integer, got {value!r}") from None
    if annotation is float:
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"expected a number, got {value!r}") from None
    return value


def _annotations(target: Callable[..., Any]) -> dict[str, Any]:
    """Parameter name -> resolved annotation (unresolvable ones are left out); a ``TypedDict``'s
    keys are its parameters."""
    if typing.is_typeddict(target):
        return typing.get_type_hints(target)
    fn = target.__init__ if inspect.isclass(target) else target  # type: ignore[misc]
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - a TYPE_CHECKING-only name: resolve parameter by parameter
        hints = {}
        for name, param in inspect.signature(fn).parameters.items():
            ann = param.annotation
            if isinstance(ann, str):
                try:
                    ann = eval(ann, getattr(fn, "__globals__", {}))  # noqa: S307 - own source
                except Exception:  # noqa: BLE001
                    continue
            if ann is not inspect.Parameter.empty:
                hints[name] = ann
    named = {
        n
        for n, p in inspect.signature(fn).parameters.items()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }
    return {n: a for n, a in hints.items() if n in named}


def typed_kwargs(
    raw: Mapping[str, str], *targets: Callable[..., Any], option: str = "--model_args"
) -> dict[str, Any]:
    """Convert each value to the type of the first target's parameter of the same name.

    Keys that no target declares stay strings (the receiving function rejects unknown ones
    itself). A value of the wrong type raises :class:`typer.BadParameter` naming the option and key.
    """
    hints = [_annotations(t) for t in targets]
    out: dict[str, Any] = {}
    for key, value in raw.items():
        ann = next((h[key] for h in hints if key in h), None)
        try:
            out[key] = value if ann is None else coerce(value, ann)
        except ValueError as exc:
            raise typer.BadParameter(f"{key}: {exc}", param_hint=option) from None
    return out


#: Parameters of the backends' loaders that the loader itself fills in (not ``--model_args`` keys).
_NOT_MODEL_ARGS = {"self", "name", "name_or_path", "model", "tokenizer", "source", "progress"}


def model_arg_keys(backend: str = "hf") -> list[str] | None:
    """The ``--model_args`` keys ``backend`` accepts (``None`` if its loader takes any keyword).

    >>> "dtype" in model_arg_keys("hf"), "base_url" in model_arg_keys("openai")
    (True, True)
    """
    targets = _arg_targets(backend)
    keys: set[str] = set()
    for target in targets:
        if typing.is_typeddict(target):
            keys.update(typing.get_type_hints(target))
            continue
        fn = target.__init__ if inspect.isclass(target) else target  # type: ignore[misc]
        for pname, param in inspect.signature(fn).parameters.items():
            if param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD):
                keys.add(pname)
    # Each loader passes **model_args on to the next target: only the last one's may be open
    # (a declared TypedDict is closed).
    last = targets[-1]
    if not typing.is_typeddict(last):
        fn = last.__init__ if inspect.isclass(last) else last  # type: ignore[misc]
        if any(p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values()):
            return None
    return sorted(keys - _NOT_MODEL_ARGS)


def _arg_targets(backend: str) -> list[Callable[..., Any]]:
    """What types ``backend``'s ``model_args``: :func:`gnll.load_model`'s own parameters, then the
    backend's declared ``TypedDict`` (which imports nothing of the backend: a Ray driver never
    loads torch to type them) or its loaders' signatures."""
    from gnll.backends import load_model
    from gnll.backends.registry import declared, get_backend

    typed = declared(backend, "model_args")
    if typed is not None:
        return [load_model, typed]
    return [load_model, *get_backend(backend).targets]


def model_kwargs(
    spec: str | None, option: str = "--model_args", *, model: str | None = None
) -> dict[str, Any]:
    """``--model_args`` for :func:`gnll.load_model`, typed by the chosen backend's parameters.

    A key the backend does not take raises :class:`typer.BadParameter` listing the keys it takes.
    Given the ``model`` name, an hf model that cannot be found is refused first, before the backend
    (torch) is imported (:func:`gnll.backends.resolve.check_model_source`).
    """
    raw = parse_kv(spec, option)
    backend = raw.get("backend", "hf")
    if model is not None and backend == "hf":
        from gnll.backends.embedded import EMBEDDED_MODELS
        from gnll.backends.resolve import check_model_source

        if model not in EMBEDDED_MODELS:
            check_model_source(model, revision=raw.get("revision"), gguf_file=raw.get("gguf_file"))
    if not raw:  # nothing to type: the backend (torch, for hf) is not imported, as on a Ray driver
        return {}
    try:
        targets = _arg_targets(backend)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None
    known = model_arg_keys(backend)
    unknown = [k for k in raw if known is not None and k not in known]
    if unknown:
        raise typer.BadParameter(
            f"unknown key {', '.join(map(repr, unknown))} for backend={backend}; "
            f"known keys: {', '.join(known or [])}",
            param_hint=option,
        )
    return typed_kwargs(raw, *targets, option=option)


def clusterer_kwargs(
    name: str, spec: str | None, option: str = "--clusterer_args"
) -> dict[str, Any]:
    """``--clusterer_args`` for :func:`gnll.semantic.load_clusterer`, typed by the clusterer's
    parameters (``auto`` resolves to the clusterer it picks)."""
    from gnll.semantic import CLUSTERERS, load_clusterer, resolve_clusterer_name

    raw = parse_kv(spec, option)
    # Resolving 'auto' looks for the NLI model on disk: only worth it when there are options to type.
    key = resolve_clusterer_name(name) if raw else name.strip().lower()
    targets: list[Callable[..., Any]] = [load_clusterer]
    if key in CLUSTERERS:
        targets.append(CLUSTERERS[key])
    return typed_kwargs(raw, *targets, option=option)
