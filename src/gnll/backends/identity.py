"""What a model *is* (for resume fingerprints) and which of its arguments may be recorded.

A cached generation may only be reused by a run of the same model: same weights, tokenizer and
chat template, same libraries computing the logits. :func:`model_identity` describes that without
loading the weights. Loader arguments fall into three kinds:

- secrets (:func:`is_secret`: any ``*key*``/``*token*``-like name such as ``api_key``,
  ``hf_token``), never written anywhere (:func:`redact`);
- throughput knobs (:data:`THROUGHPUT_KNOBS`: ``batch_size``, ``max_batch_tokens``, ...), which
  change speed and memory but not outputs, so lowering one after an out-of-memory keeps the cache;
- everything else (``dtype``, ``device``, ``chat_template``, ...), which may change outputs
  (:func:`outcome_args`).

>>> redact({"api_key": "sk-123", "max_batch_tokens": 4096, "hf_token": "x"})
{'api_key': '<redacted>', 'max_batch_tokens': 4096, 'hf_token': '<redacted>'}
>>> outcome_args({"api_key": "sk-123", "batch_size": 8, "dtype": "float32"})
{'dtype': 'float32'}
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gnll._util import file_sha256

__all__ = [
    "REDACTED",
    "THROUGHPUT_KNOBS",
    "checkpoint_identity",
    "describe_diff",
    "fill_unknown",
    "is_secret",
    "model_identity",
    "outcome_args",
    "redact",
]

REDACTED = "<redacted>"

#: Loader arguments that change speed or memory, never the generated tokens or their log-probs.
THROUGHPUT_KNOBS = frozenset(
    {
        "batch_size",
        "max_batch_tokens",
        "concurrency",
        "max_concurrency",
        "timeout",
        "max_retries",
        "backoff",
        "progress",
        "num_threads",
    }
)

_SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "credential", "credentials")
_SECRET_PARTS = frozenset({"auth", "authorization", "bearer", "cookie"})


def is_secret(name: str) -> bool:
    """Whether a loader argument named ``name`` holds a credential.

    A name is split at ``_``, ``-`` and ``.``; a part ending in *key*, *token*, *secret*,
    *password* or *credential(s)* (``api_key``, ``apikey``, ``hf_token``, ``access-token``) marks a
    secret, while ``max_batch_tokens`` or ``fast_tokenizer`` do not.

    >>> [is_secret(k) for k in ("api_key", "APIKEY", "hf_token", "max_batch_tokens", "tokenizer")]
    [True, True, True, False, False]
    """
    parts = [p for p in re.split(r"[_\-.]", name.lower()) if p]
    return any(p.endswith(_SECRET_WORDS) or p in _SECRET_PARTS for p in parts)


def redact(args: Mapping[str, Any]) -> dict[str, Any]:
    """``args`` with the value of every secret replaced by ``"<redacted>"`` (nested dicts too)."""
    out: dict[str, Any] = {}
    for k, v in args.items():
        if is_secret(str(k)) and v is not None:
            out[k] = REDACTED
        elif isinstance(v, Mapping):
            out[k] = redact(v)
        else:
            out[k] = v
    return out


def outcome_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """The loader arguments that may change outputs: no secrets, no throughput knobs."""
    return {k: v for k, v in args.items() if not is_secret(str(k)) and k not in THROUGHPUT_KNOBS}


# --------------------------------------------------------------------------- model identity
#: Small files that define the tokenizer, chat template and architecture of a checkpoint.
_DEFINING_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


def _library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("torch", "transformers", "tokenizers"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "absent"
    return out


def checkpoint_identity(directory: str | Path, *, hash_weights: bool = False) -> dict[str, Any]:
    """Content identity of a local checkpoint directory (independent of where it lies).

    The small defining files (config, tokenizer, chat template) are hashed; weight files are
    identified by name and size, or by their SHA-256 when ``hash_weights`` (slower).
    """
    d = Path(directory)
    files: dict[str, str] = {}
    for name in _DEFINING_FILES:
        if (d / name).is_file():
            files[name] = file_sha256(d / name)[:16]
    weights: dict[str, Any] = {}
    for p in sorted(d.iterdir()) if d.is_dir() else []:
        if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES):
            weights[p.name] = file_sha256(p) if hash_weights else p.stat().st_size
    return {"files": files, "weights": weights}


def _hub_commit(repo_id: str, revision: str | None) -> str | None:
    """The commit a hub id at ``revision`` resolves to in the local hub cache (no network).

    ``None`` before the first download; a resume then fills it in (see :func:`fill_unknown`).
    """
    if revision and re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except Exception:  # not a valid repo id: the load itself will say why
        return None
    return Path(hit).parent.name if isinstance(hit, str) else None  # snapshots/<commit>/...


def fill_unknown(old: Any, new: Any) -> Any:
    """``old`` with every ``None`` leaf that ``new`` knows replaced by ``new``'s value.

    A fingerprint written before a model's first download lacks its commit; that is not a
    contradiction of a later, known one.

    >>> fill_unknown({"commit": None, "repo": "a"}, {"commit": "abc", "repo": "b"})
    {'commit': 'abc', 'repo': 'a'}
    """
    if old is None:
        return new
    if isinstance(old, dict) and isinstance(new, dict):
        return {k: fill_unknown(v, new[k]) if k in new else v for k, v in old.items()}
    return old


def model_identity(name: str, model_args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What identifies the model ``load_model(name, **model_args)`` would load, without loading it.

    The model's backend says (its registered ``identity``, see
    :func:`~gnll.backends.registry.register_backend`): :func:`local_identity` for the in-process
    backend, :func:`server_identity` for servers. A backend registered without one is identified
    by its name and the model's.

    >>> ident = model_identity("smollm2-135m-instruct")
    >>> ident["kind"], sorted(ident["libraries"])
    ('embedded', ['tokenizers', 'torch', 'transformers'])
    >>> model_identity("m", {"backend": "openai", "base_url": "http://h/v1"})["kind"]
    'server'
    """
    from gnll.backends.registry import declared

    args = dict(model_args or {})
    backend = args.get("backend", "hf")
    identity = declared(backend, "identity")  # (the hf backend is not imported for it)
    if identity is None:
        return {"kind": "backend", "backend": backend, "model": name}
    result: dict[str, Any] = identity(name, args)
    return result


def server_identity(name: str, model_args: Mapping[str, Any]) -> dict[str, Any]:
    """A served model: its name and backend (the server's weights are not ours to hash)."""
    return {"kind": "server", "backend": model_args.get("backend", "openai"), "model": name}


def local_identity(name: str, model_args: Mapping[str, Any]) -> dict[str, Any]:
    """An in-process model: embedded models by their package's version (the converted float32
    checkpoint is a function of it and of the transformers version); hub ids by the resolved
    commit; local directories by their content (:func:`checkpoint_identity`); always with the
    torch, transformers and tokenizers versions."""
    from gnll._util import package_version
    from gnll.backends.registry import EMBEDDED_MODELS

    args = dict(model_args)
    ident: dict[str, Any] = {"libraries": _library_versions()}
    if name in EMBEDDED_MODELS:
        spec = EMBEDDED_MODELS[name]
        ident.update(kind="embedded", name=name, package_version=package_version(spec.package))
    elif Path(name).expanduser().is_dir():
        ident.update(kind="local", checkpoint=checkpoint_identity(Path(name).expanduser()))
    else:
        revision = args.get("revision")
        ident.update(
            kind="hub",
            repo=name,
            revision=revision or "main",
            commit=_hub_commit(name, revision),
        )
    if args.get("gguf_file"):
        ident["gguf_file"] = Path(str(args["gguf_file"])).name
    return ident


def describe_diff(old: Any, new: Any, path: str = "") -> list[str]:
    """Lines ``path: old -> new`` for every leaf where two JSON-like values differ.

    >>> describe_diff({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3}, "d": 4})
    ['a.c: 2 -> 3', 'd: (absent) -> 4']
    """
    if isinstance(old, dict) and isinstance(new, dict):
        lines = []
        for k in sorted(set(old) | set(new), key=str):
            sub = f"{path}.{k}" if path else str(k)
            if k not in old:
                lines.append(f"{sub}: (absent) -> {_short(new[k])}")
            elif k not in new:
                lines.append(f"{sub}: {_short(old[k])} -> (absent)")
            else:
                lines.extend(describe_diff(old[k], new[k], sub))
        return lines
    return [] if old == new else [f"{path or '(value)'}: {_short(old)} -> {_short(new)}"]


def _short(v: Any, n: int = 80) -> str:
    s = json.dumps(v, ensure_ascii=False, default=str)
    return s if len(s) <= n else s[: n - 3] + "..."
