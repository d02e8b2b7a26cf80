"""A backend for OpenAI-compatible completion servers (vLLM, SGLang, TGI): G-NLL at server scale.

A multi-GPU inference server already computes the chosen tokens' log-probabilities; G-NLL only needs
``logprobs=1`` on the ``/v1/completions`` endpoint, so it adds nothing to serving cost. The server must
report *raw* (temperature-1, unprocessed) log-probs: vLLM does by default (``--logprobs-mode
raw_logprobs``). What such servers cannot give is the log-prob of the stop string (they strip it), so
``include_terminator`` and beam search are refused with a clear error rather than approximated.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from gnll.backends.base import Generation, GenerationConfig, Model


class OpenAICompatModel(Model):
    """Generate through a ``/v1/completions`` server and read token log-probs from its response.

    Parameters
    ----------
    model:
        The model name the server serves.
    base_url:
        Server root including ``/v1``, e.g. ``http://localhost:8000/v1``.
    api_key:
        Sent as a bearer token if given.
    concurrency:
        Requests in flight at once; the server batches them (continuous batching).
    timeout:
        Seconds per request.

    Examples
    --------
    Against a server started with ``vllm serve meta-llama/Llama-3.1-8B`` (needs one, so not run as
    a doctest; ``tests/test_backend_openai.py`` runs this class against a loopback stand-in)::

        model = load_model("meta-llama/Llama-3.1-8B", backend="openai",
                           base_url="http://localhost:8000/v1")
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str,
        api_key: str | None = None,
        concurrency: int = 16,
        timeout: float = 120.0,
    ) -> None:
        self.name = model
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.concurrency = int(concurrency)
        self.timeout = float(timeout)

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "backend": "openai", "base_url": self.base_url}

    def render_prompt(self, prompt: str) -> str:
        # Completion servers take the text as is; apply chat formatting on the server side if wanted.
        return prompt

    def generate(
        self,
        prompts: Sequence[str],
        config: GenerationConfig | None = None,
        *,
        batch_size: int | None = None,
        progress: bool = False,
    ) -> list[list[Generation]]:
        config = config or GenerationConfig.greedy()
        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of strings; wrap a single prompt as [prompt]")
        if config.strategy == "beam":
            raise NotImplementedError(
                "beam search is not part of the OpenAI completions API; use the 'hf' backend for BS-MSP"
            )
        if config.include_terminator:
            raise NotImplementedError(
                "completion servers strip the stop string and do not report its log-prob; "
                "use include_terminator=False or the 'hf' backend"
            )
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(lambda p: self._complete(p[1], config, p[0]), enumerate(prompts)))

    def score(
        self, prompts: Sequence[str], continuations: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        raise NotImplementedError(
            "teacher-forced scoring of token ids needs the server's tokenizer; use the 'hf' backend"
        )

    def _complete(self, prompt: str, config: GenerationConfig, index: int) -> list[Generation]:
        body: dict[str, Any] = {
            "model": self.name,
            "prompt": prompt,
            "max_tokens": config.max_new_tokens,
            "n": config.num_sequences,
            "stop": list(config.stop),
            "logprobs": 1,
            "return_tokens_as_token_ids": True,  # vLLM extension: tokens come back as "token_id:123"
        }
        if config.strategy == "greedy":
            body["temperature"] = 0.0
        else:
            body["temperature"] = config.temperature
            body["top_p"] = 1.0
            if config.seed is not None:
                body["seed"] = config.seed * 1_000_003 + index
        response = self._post("/completions", body)
        choices = sorted(response.get("choices", []), key=lambda c: c.get("index", 0))
        if len(choices) != config.num_sequences:
            raise RuntimeError(
                f"server returned {len(choices)} choices for n={config.num_sequences} (prompt {index})"
            )
        return [self._parse(choice, config, index) for choice in choices]

    def _parse(self, choice: dict[str, Any], config: GenerationConfig, index: int) -> Generation:
        logprobs = choice.get("logprobs") or {}
        tokens = list(logprobs.get("tokens") or [])
        values = logprobs.get("token_logprobs")
        if values is None or len(values) != len(tokens):
            raise RuntimeError(
                f"server response for prompt {index} has no per-token logprobs; "
                "it must support `logprobs` on /v1/completions"
            )
        values = [float(v) for v in values]
        if not all(math.isfinite(v) for v in values):
            raise RuntimeError(
                f"server returned a non-finite token log-prob for prompt {index}: {values}"
            )
        token_ids: list[int] = []
        pieces: list[str] = []
        for tok in tokens:
            if isinstance(tok, str) and tok.startswith("token_id:"):
                token_ids.append(int(tok.split(":", 1)[1]))
            pieces.append(tok)
        reason = choice.get("finish_reason")
        stop_reason = choice.get("stop_reason")
        finish = (
            "length" if reason == "length" else ("stop" if isinstance(stop_reason, str) else "eos")
        )
        return Generation(
            text=str(choice.get("text", "")).strip(),
            token_ids=token_ids if len(token_ids) == len(tokens) else [],
            tokens=pieces,
            token_logprobs=values,
            finish_reason=finish,
            stop_sequence=stop_reason if isinstance(stop_reason, str) else None,
            # The server reports raw log-probs only; the tempered ones are not available.
            sampling_logprobs=None,
        )

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(
            self.base_url + path, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise RuntimeError(f"{self.base_url}{path} answered HTTP {exc.code}: {detail}") from exc
        except urllib.error.URLError as exc:
            raise ConnectionError(f"cannot reach {self.base_url}{path}: {exc.reason}") from exc
