"""``OpenAICompatModel``: G-NLL from a running inference server (vLLM, llama.cpp, OpenAI).

A server already computes the chosen tokens' log-probs, so G-NLL costs nothing on top of serving.
To be the *same* G-NLL as the in-process backend, every request pins plain greedy / plain sampling
parameters (servers fill the rest from their own defaults), instruct models get their chat template
(vLLM ``/tokenize`` with ``messages``, else the chat endpoint), and the stop-producing token the
servers keep is split off as the terminator (see :mod:`gnll.backends.openai.parse`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import replace
from typing import Any

from gnll._util.seeds import request_seed
from gnll.backends.base import (
    DEFAULT_STOP,
    Capabilities,
    Generation,
    GenerationConfig,
    GenerationErrors,
    Model,
    ScoredAnswer,
    chat_messages,
)
from gnll.backends.openai.client import HTTPClient, ServerError, resolve_api_key
from gnll.backends.openai.parse import RawTokens, read_choice, server_logprobs, to_generation
from gnll.backends.openai.servers import ServerProfile, get_profile, profile_from_models

# Substrings of served names that mark instruction-tuned models (chat template on by default).
_INSTRUCT_MARKERS = ("instruct", "-it", "_it", "chat", "-sft", "dpo")


class OpenAICompatModel(Model):
    """Generate through an OpenAI-compatible server and read the token log-probs it reports.

    Parameters
    ----------
    model:
        The model name the server serves.
    base_url:
        Server root including ``/v1``, e.g. ``http://localhost:8000/v1``.
    server:
        ``auto`` (recognised from ``GET /v1/models``), ``vllm``, ``llama-cpp-python``, ``llama.cpp``,
        ``openai`` or ``generic``: decides the pinned parameters, vendor extras and capabilities.
    chat:
        Wrap prompts in the model's chat template (on the server). Default: on when the model name
        looks instruction-tuned (``instruct``, ``chat``, ``-it``...), as in the hf backend.
    endpoint:
        ``auto``, ``completions`` or ``chat``: force one endpoint (``auto``: completions for plain
        prompts and on vLLM, the chat endpoint for chat prompts elsewhere).
    api_key:
        Bearer token. Better: ``GNLL_API_KEY`` or ``OPENAI_API_KEY`` in the environment. Never
        recorded in ``info()``, results or error messages.
    concurrency:
        Requests in flight at once (the server batches them).
    timeout, max_retries, backoff:
        Hard deadline (s) for one request, first byte to last; retries of connection errors,
        timeouts, 408/429/5xx with exponential backoff starting at ``backoff`` seconds (or the
        server's ``Retry-After``). A rejected request (other 4xx) is not retried, an invalid or
        truncated JSON body once.
    reasoning:
        ``think``, ``harmony`` or ``marker:TEXT``: the model reasons and the server runs no
        reasoning parser, so its text holds the trace; the answer after the marker is scored.
    fail_after:
        Stop the stage with one clear error once this many attempts in a row failed the same way
        within 30 s (a server answering 500 to everything), instead of retrying prompt after prompt.

    Examples
    --------
    Against ``vllm serve Qwen/Qwen2.5-7B-Instruct`` (needs a server, so not run as a doctest;
    ``tests/backends/test_server_llamacpp.py`` runs it against a real llama.cpp server)::

        model = load_model("Qwen/Qwen2.5-7B-Instruct", backend="openai",
                           base_url="http://localhost:8000/v1")
        [[g]] = model.generate(["What is the capital of France?"])
        g.text, -g.logprob   # the answer and its G-NLL
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str,
        server: str = "auto",
        chat: bool | str | None = None,
        endpoint: str = "auto",
        api_key: str | None = None,
        concurrency: int = 8,
        timeout: float = 120.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        fail_after: int = 4,
        reasoning: str | None = None,
    ) -> None:
        if endpoint not in ("auto", "completions", "chat"):
            raise ValueError(f"endpoint must be auto, completions or chat, got {endpoint!r}")
        if int(concurrency) < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.name = model
        #: The served model's reasoning format when the server runs no reasoning parser
        #: (:mod:`gnll.backends.reasoning`); with a parser, reasoning is recognised on its own.
        self.reasoning = reasoning
        self.concurrency = int(concurrency)
        self.endpoint_choice = endpoint
        if isinstance(chat, str):  # --model_args values arrive as strings
            chat = {"true": True, "1": True, "false": False, "0": False}.get(chat.lower())
        self.chat = (
            bool(chat) if chat is not None else any(m in model.lower() for m in _INSTRUCT_MARKERS)
        )
        self._server_choice = server
        self._profile: ServerProfile | None = None if server == "auto" else get_profile(server)
        self.client = HTTPClient(
            base_url,
            api_key=resolve_api_key(api_key),
            timeout=float(timeout),
            max_retries=int(max_retries),
            backoff=float(backoff),
            concurrency=self.concurrency,
            fail_after=int(fail_after),
        )
        self.base_url = self.client.base_url
        self._lock = threading.Lock()
        self._prompt_ids: dict[str, list[int]] = {}

    def __repr__(self) -> str:
        return f"OpenAICompatModel({self.name!r}, base_url={self.base_url!r})"

    # ------------------------------------------------------------------ what this server is
    @property
    def profile(self) -> ServerProfile:
        """The server's profile (probed once with ``GET /v1/models`` when ``server='auto'``)."""
        with self._lock:
            if self._profile is None:
                self._profile = profile_from_models(self.client.get("/models"), self.base_url)
            return self._profile

    @property
    def capabilities(self) -> Capabilities:
        return replace(self.profile.capabilities, chat=bool(self.chat))

    @property
    def endpoint(self) -> str:
        """``completions`` or ``chat``: where generation requests go."""
        if self.endpoint_choice != "auto":
            return self.endpoint_choice
        p = self.profile
        if not p.completions or (self.chat and not p.chat_via_tokenize):
            return "chat"
        return "completions"

    def sampling_parameters(self, config: GenerationConfig) -> dict[str, Any]:
        """The decoding parameters every request carries (temperature plus the profile's pins)."""
        temperature = 0.0 if config.strategy == "greedy" else float(config.temperature)
        return {"temperature": temperature, **self.profile.pins}

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "backend": "openai",
            "base_url": self.base_url,
            "server": self.profile.name,
            "endpoint": self.endpoint,
            "chat_template": self.chat,
            "chat_template_applied_by": (
                "server /tokenize" if self.profile.chat_via_tokenize else "server chat endpoint"
            )
            if self.chat
            else None,
            "pinned_parameters": dict(self.profile.pins),
            "vendor_extras": dict(self.profile.extras),
            "capabilities": self.capabilities.__dict__.copy(),
        }

    def render_prompt(self, prompt: str) -> str:
        if not isinstance(prompt, str):
            raise TypeError(f"prompts must be strings, got {type(prompt).__name__}")
        if self.chat and self.profile.chat_via_tokenize and self.endpoint == "completions":
            body = {"model": self.name, "tokens": self._tokenize_prompt(prompt)}
            return str(self.client.post("/detokenize", body, root=True).get("prompt", prompt))
        # Chat endpoint: the server applies the template it was started with (see info()).
        return prompt

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompts: Sequence[str],
        config: GenerationConfig | None = None,
        *,
        batch_size: int | None = None,
        progress: bool = False,
        raw_prompt: bool = False,
    ) -> list[list[Generation]]:
        config = config or GenerationConfig.greedy()
        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of strings; wrap a single prompt as [prompt]")
        if raw_prompt and not self.profile.completions:
            raise NotImplementedError(
                f"a {self.profile.name} server has no completions endpoint, so it cannot take a "
                "raw (already rendered) prompt"
            )
        caps = self.capabilities
        if config.strategy == "beam":
            raise NotImplementedError(
                f"beam search is not available through a {self.profile.name} server's OpenAI API "
                "(BS-MSP needs it); use the 'hf' backend for beams"
            )
        if config.include_terminator and not caps.terminator:
            raise NotImplementedError(
                f"a {self.profile.name} server does not report the log-prob of the token that ends "
                "the answer (end-of-sequence); use include_terminator=False, a vLLM server or the "
                "'hf' backend"
            )
        jobs: list[tuple[int, int, int]] = []  # (prompt index, n in this request, sample offset)
        n = config.num_sequences
        for i in range(len(prompts)):
            if n == 1 or self.profile.supports_n:
                jobs.append((i, n, 0))
            else:
                jobs.extend((i, 1, j) for j in range(n))
        parts: dict[int, list[tuple[int, list[Generation]]]] = {i: [] for i in range(len(prompts))}
        errors: dict[int, str] = {}
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            futures = {
                pool.submit(self._request, prompts[i], config, i, k, j, raw_prompt): (i, j)
                for i, k, j in jobs
            }
            for f in as_completed(futures):
                i, j = futures[f]
                exc = f.exception()
                if exc is None:
                    parts[i].append((j, f.result()))
                elif isinstance(exc, ServerError):
                    errors.setdefault(i, str(exc))
                else:  # unreachable server or a bug: stop now, the caller keeps what it has
                    for other in futures:
                        other.cancel()
                    raise exc
        results: list[list[Generation] | None] = []
        for i in range(len(prompts)):
            gens = [g for _, gs in sorted(parts[i], key=lambda p: p[0]) for g in gs]
            if i in errors or len(gens) != n:
                errors.setdefault(i, f"server returned {len(gens)} outputs for n={n}")
                results.append(None)
            else:
                results.append(gens)
        if errors:
            raise GenerationErrors(results, errors)
        return results  # type: ignore[return-value]

    def _seed(self, config: GenerationConfig, prompt: str, offset: int) -> int | None:
        return None if config.seed is None else request_seed(config.seed, offset, prompt)

    def _request(
        self,
        prompt: str,
        config: GenerationConfig,
        index: int,
        n: int,
        offset: int,
        raw_prompt: bool = False,
    ) -> list[Generation]:
        where = f"prompt {index}"
        seed = self._seed(config, prompt, offset)
        # A raw prompt is the exact text: the completions endpoint, no template.
        how: dict[str, Any] = {"endpoint": "completions", "chat": False} if raw_prompt else {}
        try:
            raws = self.request_raw(prompt, config, n=n, seed=seed, **how)
            return [
                to_generation(raw, config, eos_logprob=self.profile.eos_logprob, where=where)
                for raw in raws
            ]
        except ServerError as exc:
            raise ServerError(f"{where}: {exc}") from None

    def request_raw(
        self,
        prompt: str,
        config: GenerationConfig,
        *,
        n: int = 1,
        seed: int | None = None,
        top_logprobs: int = 1,
        endpoint: str | None = None,
        chat: bool | None = None,
        overrides: dict[str, Any] | None = None,
    ) -> list[RawTokens]:
        """One request as :meth:`generate` sends it; the choices before the answer/terminator split.

        ``overrides`` replace body fields (``None`` values remove them): ``gnll doctor`` uses this to
        see what the server does with its own defaults.
        """
        endpoint = endpoint or self.endpoint
        body: dict[str, Any] = {"model": self.name, **self.sampling_parameters(config)}
        if config.stop:
            body["stop"] = list(config.stop)
        if n > 1:
            body["n"] = n
        if seed is not None:
            body["seed"] = seed
        if endpoint == "chat":
            body.update(
                messages=chat_messages(prompt),  # a ChatPrompt's own turns, or one user turn
                logprobs=True,
                top_logprobs=top_logprobs,
            )
            body[self.profile.max_tokens_key] = config.max_new_tokens
            path = "/chat/completions"
        else:
            use_ids = (self.chat if chat is None else chat) and self.profile.chat_via_tokenize
            body.update(
                prompt=self._tokenize_prompt(prompt) if use_ids else prompt,
                max_tokens=config.max_new_tokens,
                logprobs=top_logprobs,
                **self.profile.extras,
            )
            path = "/completions"
        for key, value in (overrides or {}).items():
            if value is None:
                body.pop(key, None)
            else:
                body[key] = value
        choices = self.client.post(path, body).get("choices")
        if not isinstance(choices, list) or len(choices) != n:
            got = len(choices) if isinstance(choices, list) else "no"
            raise ServerError(f"server returned {got} choices for n={n}")
        choices = sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
        return [read_choice(c, reasoning=self.reasoning) for c in choices]

    def _tokenize_prompt(self, prompt: str) -> list[int]:
        """vLLM ``/tokenize`` of the chat-formatted prompt (cached: greedy and samples share it)."""
        turns = chat_messages(prompt)  # a ChatPrompt's own turns, or one user turn
        key = prompt if len(turns) == 1 else json.dumps(turns)
        if key not in self._prompt_ids:
            if len(self._prompt_ids) > 8192:
                self._prompt_ids.clear()
            self._prompt_ids[key] = self._tokenize(messages=turns, add_generation_prompt=True)
        return self._prompt_ids[key]

    def _tokenize(self, **body: Any) -> list[int]:
        answer = self.client.post("/tokenize", {"model": self.name, **body}, root=True)
        tokens = answer.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise ServerError(f"{self.client.root_url}/tokenize answered without a `tokens` list")
        return tokens

    # ------------------------------------------------------------------ scoring
    def score(
        self,
        prompts: Sequence[str],
        answers: Sequence[str],
        *,
        raw_prompt: bool = False,
        batch_size: int | None = None,
        progress: bool = False,
    ) -> list[ScoredAnswer]:
        """Teacher-forced log-probs of given answers: vLLM ``/tokenize`` + ``echo`` on token ids.

        The answer's log-probs are the echoed prompt log-probs past the prompt's own tokens; the one
        token generated after the answer tells whether greedy decoding would stop there.
        """
        if not self.capabilities.scoring:
            raise NotImplementedError(
                f"a {self.profile.name} server cannot score given answers: it returns no log-probs "
                "for prompt tokens (no `echo`); use a vLLM server or the 'hf' backend"
            )
        if isinstance(prompts, str) or isinstance(answers, str):
            raise TypeError("prompts and answers must be lists of strings")
        if len(prompts) != len(answers):
            raise ValueError(
                f"got {len(prompts)} prompts but {len(answers)} answers; pass one each"
            )
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(
                pool.map(
                    lambda a: self._score_one(*a, raw_prompt=raw_prompt),
                    zip(range(len(prompts)), prompts, answers, strict=True),
                )
            )

    def _score_one(self, index: int, prompt: str, answer: str, *, raw_prompt: bool) -> ScoredAnswer:
        where = f"prompt {index}"
        if self.chat and not raw_prompt:
            user = chat_messages(prompt)
            prefix = self._tokenize(messages=user, add_generation_prompt=True)
            full = self._tokenize(
                messages=[*user, {"role": "assistant", "content": answer}],
                add_generation_prompt=False,
                continue_final_message=True,
            )
        else:
            prefix = self._tokenize(prompt=prompt)
            full = self._tokenize(prompt=prompt + answer)
        merged = full[: len(prefix)] != prefix
        start = len(prefix)
        if merged:  # the longest common prefix is the prompt part we can trust
            start = next(
                (t for t, (a, b) in enumerate(zip(prefix, full, strict=False)) if a != b),
                min(len(prefix), len(full)),
            )
        body = {
            "model": self.name,
            "prompt": full,
            "max_tokens": 1,
            "echo": True,
            "logprobs": 1,
            **self.sampling_parameters(GenerationConfig.greedy()),
            **self.profile.extras,
        }
        response = self.client.post("/completions", body)
        choices = response.get("choices") or []
        if len(choices) != 1:
            raise ServerError(f"{where}: echo request returned {len(choices)} choices")
        raw = read_choice(choices[0])
        if len(raw.tokens) < len(full):
            raise ServerError(
                f"{where}: echo returned {len(raw.tokens)} tokens for a {len(full)}-token prompt; "
                "the server must support `echo` with `logprobs`"
            )
        span = slice(start, len(full))
        tokens = raw.tokens[span]
        values = server_logprobs(raw.logprobs[span], tokens, where)
        tops = raw.top1[span]
        is_greedy = None
        if all(t is not None for t in tops):
            is_greedy = all(v >= t[1] - 1e-6 for v, t in zip(values, tops, strict=True))  # type: ignore[index]
        nxt = raw.tokens[len(full)] if len(raw.tokens) > len(full) else None
        eos_next = raw.finish_reason == "stop" and raw.stop_reason is None
        greedy_stops = (
            None
            if nxt is None
            else bool(
                eos_next
                or any(s in nxt or (nxt.strip() and s.startswith(nxt)) for s in DEFAULT_STOP)
            )
        )
        return ScoredAnswer(
            text=answer,
            token_ids=full[span],
            tokens=tokens,
            token_logprobs=values,
            is_greedy=is_greedy,
            greedy_stops=greedy_stops,
            boundary_merged=merged,
        )
