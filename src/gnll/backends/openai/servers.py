"""What each kind of server needs to be asked, and what it can give back.

Every server fills unpinned sampling parameters from its own defaults (vLLM from the model's
``generation_config.json``; llama.cpp: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
repeat_penalty 1.1 in llama-cpp-python), so each profile lists the parameters that make decoding plain
greedy / plain multinomial sampling, in the names that server understands. Vendor extras go only to
the servers that accept them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gnll.backends.base import Capabilities

#: Values of ``GET /v1/models`` ``owned_by`` that identify a server.
_OWNERS = {"vllm": "vllm", "me": "llama-cpp-python", "llamacpp": "llama.cpp", "gnll": "gnll"}


@dataclass(frozen=True)
class ServerProfile:
    """How to talk to one kind of OpenAI-compatible server.

    Attributes
    ----------
    name:
        ``vllm``, ``llama-cpp-python``, ``llama.cpp``, ``openai``, ``gnll`` or ``generic``.
    pins:
        Neutral sampling parameters sent with every request (besides ``temperature``).
    extras:
        Vendor fields sent with every completions request.
    completions:
        Whether ``/v1/completions`` returns per-token log-probs (OpenAI's chat models: no).
    chat_via_tokenize:
        Instruct prompts go through vLLM's ``/tokenize`` (``messages`` + ``add_generation_prompt``) and
        are sent to ``/v1/completions`` as token ids; otherwise through ``/v1/chat/completions``.
    supports_n:
        Honours ``n`` (several samples in one request); otherwise one request per sample.
    eos_logprob:
        Reports the end-of-sequence token's log-prob when generation ends there.
    max_tokens_key:
        The chat endpoint's name for the token cap.
    logprobs_need_top:
        Returns log-probs only when at least one alternative is asked for too (chat
        ``top_logprobs >= 1``, completions ``logprobs >= 1``): llama-cpp-python's chat does, and
        servers not known otherwise are asked for one. Elsewhere none are asked for: they cost
        the server time, and G-NLL does not read them.
    echo:
        ``/v1/completions`` returns prompt log-probs with ``echo`` (used by ``gnll doctor`` to compare
        generated log-probs with teacher-forced ones).
    responses_logprobs:
        Its own ``/v1/responses`` returns the answer's token log-probs (vLLM 0.32: whole and
        streamed; a whole answer's include the end-of-sequence token's, as on chat): a proxy passes
        such requests through (:mod:`gnll.serving.native`).
    capabilities:
        What the backend can compute through this server.
    structured_logprobs:
        Which distribution the log-probs of an answer decoded under the server's grammar (a JSON
        ``response_format``, a required or named tool call, a ``strict`` tool's call) are:
        ``"raw"`` (the model's own, the grammar not applied), ``"constrained"`` (after the
        grammar's mask: renormalised over the tokens it allowed; a forced token reports 0) or
        ``"unknown"`` (not established here). Measured on vLLM 0.32's CPU build with its default
        ``--logprobs-mode raw_logprobs``: constrained (teacher forcing without the grammar gives
        the raw ones; they agree where no grammar applies); on llama-cpp-python: raw (a forced
        token keeps its log-prob, below the unconstrained top alternative).
    """

    name: str
    pins: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    completions: bool = True
    chat_via_tokenize: bool = False
    supports_n: bool = False
    eos_logprob: bool = False
    max_tokens_key: str = "max_tokens"
    echo: bool = False
    logprobs_need_top: bool = True
    responses_logprobs: bool = False
    capabilities: Capabilities = field(default_factory=Capabilities)
    structured_logprobs: str = "unknown"


def _caps(*, scoring: bool, terminator: bool, top_logprobs: int) -> Capabilities:
    # No server's OpenAI API offers beam search with stop strings, nor tempered log-probs.
    return Capabilities(
        beams=False,
        scoring=scoring,
        terminator=terminator,
        chat=True,
        sampling_logprobs=False,
        top_logprobs=top_logprobs,
    )


_PLAIN = {"top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}

PROFILES: dict[str, ServerProfile] = {
    "vllm": ServerProfile(
        name="vllm",
        # top_k=-1 means "disabled" on every vLLM version (0 was rejected by older ones).
        pins={**_PLAIN, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0},
        extras={"return_token_ids": True},
        chat_via_tokenize=True,
        supports_n=True,
        echo=True,
        eos_logprob=True,
        logprobs_need_top=False,
        responses_logprobs=True,
        capabilities=_caps(scoring=True, terminator=True, top_logprobs=20),
        structured_logprobs="constrained",
    ),
    "llama-cpp-python": ServerProfile(
        name="llama-cpp-python",
        pins={
            **_PLAIN,
            "top_k": 0,
            "min_p": 0.0,
            "typical_p": 1.0,
            "repeat_penalty": 1.0,
            "mirostat_mode": 0,
        },
        echo=True,
        # It drops the EOS token from the returned tokens, so "ending here" has no log-prob.
        capabilities=_caps(scoring=False, terminator=False, top_logprobs=20),
        # Measured (0.3.x): a named tool call's grammar-forced tokens keep their raw log-probs.
        structured_logprobs="raw",
    ),
    "llama.cpp": ServerProfile(
        name="llama.cpp",
        pins={
            **_PLAIN,
            "top_k": 0,
            "min_p": 0.0,
            "typical_p": 1.0,
            "repeat_penalty": 1.0,
            "mirostat": 0,
            "dry_multiplier": 0.0,
            "xtc_probability": 0.0,
        },
        capabilities=_caps(scoring=False, terminator=False, top_logprobs=20),
    ),
    "openai": ServerProfile(
        name="openai",
        pins=dict(_PLAIN),
        completions=False,
        supports_n=True,
        logprobs_need_top=False,
        max_tokens_key="max_completion_tokens",
        capabilities=_caps(scoring=False, terminator=False, top_logprobs=20),
    ),
    # `gnll serve` itself: greedy when temperature is 0, raw log-probs, alternatives from the hf
    # decoding loop; answer tokens only (no terminator), no echo.
    "gnll": ServerProfile(
        name="gnll",
        pins=dict(_PLAIN),
        supports_n=True,
        logprobs_need_top=False,
        capabilities=_caps(scoring=False, terminator=False, top_logprobs=20),
        structured_logprobs="raw",
    ),
    "generic": ServerProfile(
        name="generic",
        pins=dict(_PLAIN),
        capabilities=_caps(scoring=False, terminator=False, top_logprobs=1),
    ),
}


def profile_from_models(models: dict[str, Any], base_url: str) -> ServerProfile:
    """Recognise the server from its ``GET /v1/models`` answer (``owned_by``) or its address.

    Examples
    --------
    >>> profile_from_models({"data": [{"id": "m", "owned_by": "vllm"}]}, "http://h:8000/v1").name
    'vllm'
    >>> profile_from_models({"data": []}, "https://api.openai.com/v1").name
    'openai'
    """
    if "api.openai.com" in base_url:
        return PROFILES["openai"]
    for entry in models.get("data") or []:
        owner = str(entry.get("owned_by", "")).lower() if isinstance(entry, dict) else ""
        if owner in _OWNERS:
            return PROFILES[_OWNERS[owner]]
        if owner in ("openai", "system", "openai-internal"):
            return PROFILES["openai"]
    return PROFILES["generic"]


def get_profile(name: str) -> ServerProfile:
    if name not in PROFILES:
        raise ValueError(f"unknown server {name!r}; choose one of {', '.join(PROFILES)} or 'auto'")
    return PROFILES[name]
