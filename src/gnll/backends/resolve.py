"""Local-first resolution of a model name, so that a typo fails at once with the known names.

transformers would send any unknown name to the Hugging Face hub, and offline that is about a minute
of retries before an ``OSError`` that does not say which names would have worked. Here a name is
looked for locally first (an embedded model is handled by the caller; then a directory, then the hub
cache), and the hub is only asked, with one short request, for a name that could be a hub id.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["HubUnreachable", "ModelNotFound", "check_model_source"]

#: Seconds for the one request that asks the hub whether a repository exists.
PROBE_TIMEOUT = 5.0


class ModelNotFound(ValueError):
    """A model name that is not embedded, not a local path, not cached and not on the hub."""


class HubUnreachable(ConnectionError):
    """A model name that is not local or cached, with the hub out of reach (a network failure)."""


def _known() -> str:
    from gnll.backends.embedded import EMBEDDED_MODELS

    return ", ".join(EMBEDDED_MODELS)


def _cached(name: str, revision: str | None, filename: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        hit = try_to_load_from_cache(name, filename, revision=revision)
    except Exception:  # noqa: BLE001 - an id the cache cannot even parse is simply not cached
        return False
    return isinstance(hit, str)


def _offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().lower() in ("1", "true", "yes", "on")


def check_model_source(
    name: str, *, revision: str | None = None, gguf_file: str | None = None
) -> None:
    """Raise :class:`ModelNotFound` (or :class:`HubUnreachable`) unless ``name`` can be loaded
    without a long hub wait.

    Accepted at once: a local path, and a hub id whose files are in the hub cache. A name without
    an ``org/`` part that is neither is refused without asking the hub (every current hub model id
    has one), as is any uncached name when ``HF_HUB_OFFLINE`` is set. Otherwise one short request
    asks the hub whether the repository exists.
    """
    if Path(name).expanduser().exists():
        return
    if _cached(name, revision, gguf_file or "config.json"):
        return
    where = (
        f"not an embedded model ({_known()}), not a local path and not in the Hugging Face cache"
    )
    if _offline():
        raise ModelNotFound(f"{name!r} is {where} (HF_HUB_OFFLINE is set, so the hub is not asked)")
    if "/" not in name:
        raise ModelNotFound(f"{name!r} is {where}; a hub model is named org/name")
    from huggingface_hub import model_info
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        model_info(name, revision=revision, timeout=PROBE_TIMEOUT)
    except GatedRepoError:
        return  # it exists; the download says what access it needs
    except RepositoryNotFoundError:
        raise ModelNotFound(f"{name!r} is {where}, and the hub has no such model") from None
    except Exception as exc:  # noqa: BLE001 - no network, DNS, proxy: all mean the same here
        raise HubUnreachable(
            f"{name!r} is {where}, and the hub cannot be reached ({type(exc).__name__}); "
            "download it where there is network, or set HF_HUB_OFFLINE=1 to work from the cache"
        ) from None
