"""The transformers backend: batched generation with exact token log-probabilities.

Greedy decoding and sampling run gnll's own decoding loop on the model's forward pass (KV cache, left
padding), because that makes savings possible that ``model.generate`` cannot offer:

* **log-probs in the same pass** -- each step's raw logits are already at hand for choosing the token,
  so ``log_softmax(raw_logits)[chosen]`` is one ``logsumexp`` and one gather; no logits processor,
  no extra copy, nothing of size steps x vocab is stored;
* **finished rows leave the batch** -- a row that hit a stop token is dropped from the batch and the
  KV cache, so a batch costs what its live rows cost, not ``rows x longest answer``;
* **no repeated prompt work** -- the prompt tokens that all prompts of a call share (the instruction
  and few-shot examples of an evaluation task) are run through the model once and their KV cache is
  reused by every row; the N samples of one prompt prefill the prompt once and copy its cache N times;
* **no cache re-concatenation** -- full-attention layers append to a buffer in place
  (:class:`_GrowingLayer`) instead of ``torch.cat``-ing the whole cache at every step.

Samples are drawn by inverse-CDF sampling with one seeded uniform stream per (prompt, sample), so they
depend on the seed, the prompt and its position in the call -- not on batch size or on which rows
finished early. Beam search uses transformers' implementation (fed with the same shared-prefix cache)
and its outputs are scored by one teacher-forced pass. Models whose cache is not a plain attention
KV cache (recurrent or chunked-attention layers) fall back to ``model.generate`` with a logits
processor that records the log-probs.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    DynamicCache,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers import GenerationConfig as HFGenerationConfig
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from gnll.backends.base import Generation, GenerationConfig, Model

logger = logging.getLogger(__name__)

# Substrings that mark instruction-tuned checkpoints when the caller does not say (chat_template="auto").
_INSTRUCT_MARKERS = ("instruct", "-it", "_it", "chat", "-sft", "dpo")

#: Shared prompt prefixes shorter than this are not worth a separate forward pass and cache copy.
MIN_SHARED_PREFIX = 16

#: The fixed cost of one extra forward pass, in prompt positions (reading every weight once costs
#: about as much as running ~20 positions through a small model on CPU). Prefill groups are chosen
#: with it: see :func:`prefill_groups`.
FORWARD_COST_POSITIONS = 24

#: Finished rows are dropped from the batch (one copy of the KV cache) once they are at least this
#: fraction of the live rows; until then they ride along, which costs one position each per step.
COMPACT_FRACTION = 1 / 8


def pack_batches(
    lengths: Sequence[int],
    *,
    max_prompts: int,
    rows_per_prompt: int = 1,
    extra: int = 0,
    max_tokens: int | None = None,
) -> list[list[int]]:
    """Cut prompts (sorted longest first) into consecutive batches under a row and a token budget.

    A batch of prompts ``i..j`` holds ``(j - i + 1) x rows_per_prompt`` rows whose cache reaches
    ``lengths[i] + extra`` positions; it is closed before that product would exceed ``max_tokens``.
    A prompt that alone exceeds the budget still gets a batch of its own.

    >>> pack_batches([300, 200, 100, 100], max_prompts=3, extra=20, max_tokens=700)
    [[0, 1], [2, 3]]
    >>> pack_batches([300, 200, 100, 100], max_prompts=3)
    [[0, 1, 2], [3]]
    """
    if any(a < b for a, b in zip(lengths, lengths[1:], strict=False)):
        raise ValueError("pack_batches needs lengths sorted longest first")
    batches: list[list[int]] = []
    for i in range(len(lengths)):
        if batches:
            cur = batches[-1]
            rows = (len(cur) + 1) * rows_per_prompt
            within = max_tokens is None or rows * (lengths[cur[0]] + extra) <= max_tokens
            if len(cur) < max_prompts and within:
                cur.append(i)
                continue
        batches.append([i])
    return batches


def prefill_groups(
    lengths: Sequence[int], forward_cost: float = FORWARD_COST_POSITIONS
) -> list[list[int]]:
    """Split rows into prefill groups so that padding does not cost more than extra forwards.

    A batch prefilled in one forward pass is padded to its longest row, so a batch whose prompt
    suffixes are 20 to 60 tokens long runs twice the positions it needs. Rows sorted by length are cut
    into contiguous groups minimising ``sum(group size x longest in group) + forward_cost x groups``
    (exact dynamic programme, O(rows^2)).

    Returns lists of row indices, longest rows first.

    >>> prefill_groups([5, 60, 58, 6, 59, 4], forward_cost=24)
    [[1, 4, 2], [3, 0, 5]]
    >>> prefill_groups([30, 31, 29], forward_cost=24)
    [[1, 0, 2]]
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    sizes = [lengths[i] for i in order]
    n = len(sizes)
    best = [0.0] + [float("inf")] * n  # best[j]: cost of the first j sorted rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):  # rows i..j-1 form the last group; sizes[i] is its longest
            c = best[i] + (j - i) * sizes[i] + forward_cost
            if c < best[j]:
                best[j], cut[j] = c, i
    groups: list[list[int]] = []
    j = n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


class _GrowingLayer(DynamicLayer):
    """A full-attention KV cache layer that appends in place instead of re-concatenating.

    ``DynamicLayer`` rebuilds keys and values with ``torch.cat`` at every step, copying the whole
    cache (batch x prompt length) per layer and token. This layer keeps a buffer with room for
    ``reserve`` more tokens and exposes ``keys``/``values`` as views of its filled part. Anything
    that replaces them (dropping finished rows, beam reordering, repeating rows) leaves a tensor
    that is not a view of the buffer, and the next update starts a new buffer from it.
    """

    def __init__(self, reserve: int = 0) -> None:
        super().__init__()
        self.reserve = max(0, int(reserve))
        self._kbuf: torch.Tensor | None = None
        self._vbuf: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        have = self.get_seq_length()
        new = key_states.shape[-2]
        buf = self._kbuf
        if (
            have == 0
            or not self._owns_buffer()
            or buf.shape[0] != key_states.shape[0]
            or have + new > buf.shape[-2]
        ):
            b, h, _, d = key_states.shape
            cap = have + new + max(self.reserve, (have + new) // 2 if buf is not None else 0)
            kbuf = key_states.new_empty((b, h, cap, d))
            vbuf = value_states.new_empty((b, value_states.shape[1], cap, value_states.shape[-1]))
            if have:
                kbuf[:, :, :have] = self.keys
                vbuf[:, :, :have] = self.values
            self._kbuf, self._vbuf = kbuf, vbuf
        self._kbuf[:, :, have : have + new] = key_states
        self._vbuf[:, :, have : have + new] = value_states
        self.keys = self._kbuf[:, :, : have + new]
        self.values = self._vbuf[:, :, : have + new]
        return self.keys, self.values

    def allocate(self, like: torch.Tensor, batch: int, length: int) -> None:
        """Make ``keys``/``values`` uninitialised ``batch x heads x length x dim`` views to fill."""
        self.lazy_initialization(like, like)
        b, h, _, d = like.shape
        self._kbuf = like.new_empty((batch, h, length + self.reserve, d))
        self._vbuf = like.new_empty((batch, h, length + self.reserve, d))
        self.keys, self.values = self._kbuf[:, :, :length], self._vbuf[:, :, :length]

    def _owns_buffer(self) -> bool:
        return (
            self._kbuf is not None
            and self.is_initialized
            and self.keys.data_ptr() == self._kbuf.data_ptr()
            and self.values.data_ptr() == self._vbuf.data_ptr()
        )

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        # Selecting rows of the whole buffer is one copy and keeps the room reserved for the answer;
        # selecting the filled view would copy once here and once more at the next update.
        if not self._owns_buffer():
            return super().batch_select_indices(indices)
        have = self.get_seq_length()
        self._kbuf = self._kbuf[indices]
        self._vbuf = self._vbuf[indices]
        self.keys, self.values = self._kbuf[:, :, :have], self._vbuf[:, :, :have]

    def batch_repeat_interleave(self, repeats: int) -> None:
        if not self._owns_buffer():
            return super().batch_repeat_interleave(repeats)
        have = self.get_seq_length()
        self._kbuf = self._kbuf.repeat_interleave(repeats, dim=0)
        self._vbuf = self._vbuf.repeat_interleave(repeats, dim=0)
        self.keys, self.values = self._kbuf[:, :, :have], self._vbuf[:, :, :have]


@dataclass
class _Prefix:
    """Token ids shared by every prompt of a call and their KV cache (one row per layer)."""

    ids: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]


def _with_prefix(cache: DynamicCache, prefix: _Prefix | None, rows: int) -> DynamicCache:
    """Copy the shared prefix's keys/values into every one of ``rows`` rows of an empty ``cache``."""
    if prefix is not None:
        for layer, (k, v) in zip(cache.layers, prefix.kv, strict=True):
            layer.update(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1))
    return cache


@dataclass
class _Prefilled:
    """A batch after its prompts went through the model: the layout, its cache and last logits.

    Rows are laid out as ``[shared prefix | left padding | own suffix]``; with no shared prefix this
    is ordinary left padding. Position ids count real tokens only, so the padding hole in the middle
    changes nothing for the model (see :meth:`HFModel._prefix_usable` for sliding windows).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    cache: DynamicCache
    logits: torch.Tensor | None


class _LogprobRecorder(LogitsProcessor):
    """Records log p(chosen token) under the raw logits, and under the tempered ones when sampling.

    It must be the only logits processor, so ``scores`` are the model's raw float32 logits. Sampling at
    temperature tau is done here (returning ``scores / tau``) rather than by transformers' warper, so
    the processor order cannot hide the raw logits from us.
    """

    def __init__(self, temperature: float, stop_ids: torch.Tensor) -> None:
        self.temperature = temperature
        self.stop_ids = stop_ids
        self.raw: list[torch.Tensor] = []
        self.tempered: list[torch.Tensor] = []
        self._prev: torch.Tensor | None = None
        self._active: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._prev is not None:
            self._collect(input_ids[:, -1])
        self._prev = scores
        if self.temperature != 1.0:
            return scores / self.temperature
        return scores

    def finish(self, last_tokens: torch.Tensor) -> None:
        if self._prev is not None:
            self._collect(last_tokens)
            self._prev = None

    def _collect(self, chosen: torch.Tensor) -> None:
        prev = self._prev
        rows = prev.shape[0]
        if self._active is None:
            self._active = torch.ones(rows, dtype=torch.bool, device=prev.device)
        raw = torch.zeros(rows, dtype=torch.float32, device=prev.device)
        tempered = torch.zeros_like(raw) if self.temperature != 1.0 else None
        # Rows that already stopped only emit padding; skipping their logsumexp keeps the overhead
        # proportional to the live rows, not to the batch.
        idx = self._active.nonzero(as_tuple=True)[0]
        if idx.numel():
            logits = prev if idx.numel() == rows else prev.index_select(0, idx)
            tok = chosen.index_select(0, idx).unsqueeze(1)
            chosen_logit = logits.gather(1, tok).squeeze(1)
            raw[idx] = chosen_logit - torch.logsumexp(logits, dim=-1)
            if tempered is not None:
                scaled = logits / self.temperature
                tempered[idx] = chosen_logit / self.temperature - torch.logsumexp(scaled, dim=-1)
        self.raw.append(raw)
        if tempered is not None:
            self.tempered.append(tempered)
        self._active &= ~torch.isin(chosen, self.stop_ids)

    def stacked(self) -> tuple[np.ndarray, np.ndarray | None]:
        raw = torch.stack(self.raw, dim=1).double().cpu().numpy()
        tempered = (
            torch.stack(self.tempered, dim=1).double().cpu().numpy() if self.tempered else None
        )
        return raw, tempered


class _StopStrings(StoppingCriteria):
    """Per-row stop when the newly generated text contains a stop string spanning several tokens.

    transformers' ``StopStringCriteria`` pre-computes a table over the whole vocabulary (about a minute
    for Gemma's 262k tokens); decoding the last few new tokens of each live row is cheap instead.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, stop: tuple[str, ...], prompt_len: int
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.prompt_len = prompt_len
        # A stop string of c characters spans at most c tokens (+1 for a partial leading token).
        self.window = max(len(s) for s in stop) + 1

    def __call__(
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any
    ) -> torch.BoolTensor:
        tail = input_ids[:, max(self.prompt_len, input_ids.shape[1] - self.window) :]
        texts = self.tokenizer.batch_decode(tail)
        done = [any(s in t for s in self.stop) for t in texts]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class HFModel(Model):
    """A causal LM from transformers behind the :class:`~gnll.backends.base.Model` interface.

    Parameters
    ----------
    model, tokenizer:
        A loaded causal LM and its tokenizer.
    name:
        Name recorded in results.
    chat_template:
        Wrap prompts as a user turn of the tokenizer's chat template. ``None`` decides from the name
        (instruction-tuned checkpoints) and whether the tokenizer has a template.
    batch_size:
        Default number of sequences (rows) per forward pass; sampling N per prompt uses N rows a prompt.
        Decoding steps of a small model on CPU cost about as much for 64 rows as for 10 (per-step
        overhead dominates), so wide batches are what make sampling and beams affordable.
    max_batch_tokens:
        Bound on ``rows x (longest prompt + max_new_tokens)`` of a batch: the KV cache positions it
        holds. Batches of long prompts get fewer rows, so peak memory depends on this budget, not on
        the longest prompt a run happens to meet. The default fits 64 rows of a 5-shot short-answer
        prompt (about 270 tokens) and its answer in one batch: a leftover batch of a few rows would
        pay the whole per-step cost of decoding again. ``None`` bounds by rows only.
    source:
        Where the weights came from, recorded by :meth:`info`.

    Examples
    --------
    >>> from gnll import load_model
    >>> model = load_model("smollm2-135m-instruct", progress=False)
    >>> [[gen]] = model.generate(["What is the capital of France?"])
    >>> len(gen.token_logprobs) == len(gen.token_ids) > 0, max(gen.token_logprobs) <= 0
    (True, True)
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        name: str,
        chat_template: bool | None = None,
        batch_size: int = 64,
        max_batch_tokens: int | None = 20480,
        source: str | None = None,
    ) -> None:
        if int(batch_size) < 1 or (max_batch_tokens is not None and int(max_batch_tokens) < 1):
            raise ValueError(
                f"batch_size ({batch_size}) and max_batch_tokens ({max_batch_tokens}) must be >= 1"
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.batch_size = int(batch_size)
        self.max_batch_tokens = None if max_batch_tokens is None else int(max_batch_tokens)
        self.source = source or name
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if chat_template is None:
            chat_template = has_template and any(m in name.lower() for m in _INSTRUCT_MARKERS)
        if chat_template and not has_template:
            raise ValueError(
                f"chat_template=True but the tokenizer of {name!r} has no chat template"
            )
        self.chat_template = bool(chat_template)
        self._stop_id_cache: dict[tuple[str, ...], torch.Tensor] = {}

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        *,
        name: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        revision: str | None = None,
        trust_remote_code: bool = False,
        gguf_file: str | None = None,
        fast_tokenizer: bool = False,
        **kwargs: Any,
    ) -> HFModel:
        """Load any Hugging Face hub id or local directory (optionally a GGUF file inside it).

        ``fast_tokenizer=True`` builds the tokenizer straight from a local ``tokenizer.json`` (see
        :func:`load_tokenizer_json`); gnll uses it for its own cached checkpoints.
        """
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        torch_dtype = _resolve_dtype(dtype, device)
        common = {"revision": revision, "trust_remote_code": trust_remote_code}
        if gguf_file:
            common["gguf_file"] = gguf_file
        if fast_tokenizer and not gguf_file:
            tokenizer = load_tokenizer_json(name_or_path)
        else:
            tokenizer = AutoTokenizer.from_pretrained(name_or_path, **common)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype, **common)
        model.to(device)
        return cls(model, tokenizer, name=name or name_or_path, source=name_or_path, **kwargs)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "architecture": type(self.model).__name__,
            "dtype": str(next(self.model.parameters()).dtype),
            "device": str(self.device),
            "chat_template": self.chat_template,
            "vocab_size": len(self.tokenizer),
        }

    # ------------------------------------------------------------------ prompts
    def render_prompt(self, prompt: str) -> str:
        if not isinstance(prompt, str):
            raise TypeError(f"prompts must be strings, got {type(prompt).__name__}")
        if not self.chat_template:
            return prompt
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )

    def _encode(self, prompts: Sequence[str]) -> list[list[int]]:
        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of strings; wrap a single prompt as [prompt]")
        texts = [self.render_prompt(p) for p in prompts]
        # A chat template already contains the special tokens (BOS etc.); plain prompts get them here.
        enc = self.tokenizer(texts, add_special_tokens=not self.chat_template)
        return [list(ids) for ids in enc["input_ids"]]

    # ------------------------------------------------------------------ stops
    @cached_property
    def _eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        gen_eos = getattr(self.model.generation_config, "eos_token_id", None)
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif gen_eos:
            ids.update(gen_eos)
        return {i for i in ids if i is not None}

    def _stop_token_ids(self, stop: tuple[str, ...]) -> torch.Tensor:
        """EOS ids plus every token whose text contains a stop string (e.g. any token with a newline).

        Treating those tokens as end-of-sequence makes every decoding strategy, beam search included,
        end a hypothesis where the answer ends. Finding them means decoding the whole vocabulary once,
        so the result is cached on disk per tokenizer.
        """
        if stop not in self._stop_id_cache:
            ids = set(self._eos_ids) | set(_stop_vocab_ids(self.tokenizer, stop))
            self._stop_id_cache[stop] = torch.tensor(
                sorted(ids), dtype=torch.long, device=self.device
            )
        return self._stop_id_cache[stop]

    def _token_strings(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.decode([i]) for i in ids]

    # ------------------------------------------------------------------ fast-path capabilities
    @cached_property
    def _fast_decode(self) -> bool:
        """Whether gnll's own decoding loop can drive this model (plain attention KV caches only).

        The loop needs ``attention_mask``/``position_ids``/``past_key_values`` in ``forward`` and a
        cache whose layers can be copied, expanded and row-selected independently; recurrent states
        or chunked attention would not survive a padding hole or a row being dropped.
        """
        model = self.model
        if model.config.is_encoder_decoder:
            return False
        params = set(inspect.signature(model.forward).parameters)
        if not {"attention_mask", "position_ids", "past_key_values"} <= params:
            return False
        if hasattr(model, "_supports_default_dynamic_cache") and not (
            model._supports_default_dynamic_cache()
        ):
            return False
        try:
            layers = DynamicCache(config=model.config).layers
        except Exception:  # an exotic config that DynamicCache cannot read: use model.generate
            return False
        return bool(layers) and all(
            type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers
        )

    @cached_property
    def _sliding_window(self) -> int | None:
        """The smallest sliding attention window of the model's layers, if any."""
        windows = [
            layer.sliding_window
            for layer in DynamicCache(config=self.model.config).layers
            if isinstance(layer, DynamicSlidingWindowLayer)
        ]
        return min(windows) if windows else None

    @cached_property
    def _supports_logits_to_keep(self) -> bool:
        return "logits_to_keep" in inspect.signature(self.model.forward).parameters

    def _new_cache(self, reserve: int = 0) -> DynamicCache:
        """The model's own cache layout, with in-place growing layers for full attention."""
        cache = DynamicCache(config=self.model.config)
        cache.layers = [
            _GrowingLayer(reserve) if type(layer) is DynamicLayer else layer
            for layer in cache.layers
        ]
        return cache

    def _forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        cache: DynamicCache,
        keep: int,
    ) -> torch.Tensor:
        """One forward pass extending ``cache``; returns the float32 logits of the last ``keep`` columns."""
        kwargs: dict[str, Any] = {}
        if self._supports_logits_to_keep:
            # Only the needed positions go through the LM head (a seq x vocab tensor otherwise).
            kwargs["logits_to_keep"] = keep
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            **kwargs,
        )
        # float32 models: .float() is a no-op, not a copy.
        return out.logits[:, -keep:].float()

    # ------------------------------------------------------------------ shared prompt work
    @torch.inference_mode()
    def _shared_prefix(
        self, rows: Sequence[Sequence[int]], cap: int | None = None
    ) -> _Prefix | None:
        """Run the tokens every row starts with through the model once (``None`` if not worth it).

        ``cap`` bounds the prefix length (scoring must keep each prompt's last token out of it). At
        least one token of every row always stays outside the prefix, so each row has a query.
        """
        if len(rows) < 2 or not self._fast_decode:
            return None
        first = rows[0]
        n = min(len(r) for r in rows) - 1
        if cap is not None:
            n = min(n, cap)
        for r in rows[1:]:
            k = 0
            while k < n and r[k] == first[k]:
                k += 1
            n = k
            if n < MIN_SHARED_PREFIX:
                return None
        ids = list(first[:n])
        cache = DynamicCache(config=self.model.config)
        self._forward(torch.tensor([ids], device=self.device), None, None, cache, keep=1)
        return _Prefix(ids=ids, kv=[(layer.keys, layer.values) for layer in cache.layers])

    def _prefix_usable(
        self, prefix: _Prefix | None, rows: Sequence[Sequence[int]], extra: int
    ) -> bool:
        """Whether ``rows`` may use ``prefix`` without changing any attention the model computes.

        Full attention ignores a masked padding hole. A sliding window counts columns, so a hole
        between prefix and suffix would push real tokens out of the window, and a sliding layer
        keeps only the last window of the prefix's keys; allow sharing only when the whole sequence
        (``extra`` generated tokens included) fits inside the window.
        """
        if prefix is None:
            return False
        window = self._sliding_window
        return window is None or max(len(r) for r in rows) + extra <= window

    def _prefill(
        self,
        rows: Sequence[Sequence[int]],
        prefix: _Prefix | None,
        *,
        upto: int = 0,
        keep: int = 1,
        reserve: int = 0,
    ) -> _Prefilled:
        """Lay out ``rows`` (shared prefix, padding hole, suffix) and run them into a KV cache.

        The last ``upto`` columns are left for the caller (``upto=1``: ``model.generate`` must see at
        least one new token); otherwise the logits of the last ``keep`` columns are returned. The
        cache leaves room for ``reserve`` generated tokens.
        """
        plen = len(prefix.ids) if prefix is not None else 0
        width = max(len(r) for r in rows)
        batch = len(rows)
        input_ids = torch.full((batch, width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        if plen:
            input_ids[:, :plen] = torch.tensor(prefix.ids)
            mask[:, :plen] = 1
        for i, row in enumerate(rows):
            suffix = row[plen:]
            input_ids[i, width - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            mask[i, width - len(suffix) :] = 1
        # Positions count real tokens only (as transformers derives them from the mask).
        position_ids = (mask.cumsum(1) - 1).clamp_(min=0)
        input_ids, mask, position_ids = (t.to(self.device) for t in (input_ids, mask, position_ids))
        end = width - upto
        groups = prefill_groups([len(r) - plen for r in rows])
        if len(groups) > 1 and self._groups_fit(width + reserve):
            cache, logits = self._prefill_grouped(
                groups, input_ids, mask, position_ids, prefix, end=end, keep=keep, reserve=reserve
            )
            return _Prefilled(input_ids, mask, position_ids, cache, logits)
        cache = _with_prefix(self._new_cache(reserve), prefix, batch)
        logits = None
        if end > plen:
            logits = self._forward(
                input_ids[:, plen:end], mask[:, :end], position_ids[:, plen:end], cache, keep=keep
            )
        return _Prefilled(input_ids, mask, position_ids, cache, logits)

    def _groups_fit(self, columns: int) -> bool:
        """Whether group-wise prefill can assemble this model's cache exactly.

        Assembly writes every group's keys into one padded layout; that needs caches that keep all
        columns: full attention, or sliding windows the whole sequence fits in.
        """
        window = self._sliding_window
        return window is None or columns <= window

    def _prefill_grouped(
        self,
        groups: list[list[int]],
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        position_ids: torch.Tensor,
        prefix: _Prefix | None,
        *,
        end: int,
        keep: int,
        reserve: int,
    ) -> tuple[DynamicCache, torch.Tensor | None]:
        """Prefill rows group by group, each padded only to its own longest row, then assemble.

        Every group runs its own columns ``[width - w_g, end)`` (after the shared prefix, if any); its
        keys and values are copied into the batch layout at the same columns, and the columns a group
        did not run are padding (zero keys under a zero attention mask), exactly as in one big pass.
        """
        batch, width = input_ids.shape
        plen = len(prefix.ids) if prefix is not None else 0
        real = mask[:, plen:].sum(1).tolist()
        final = self._new_cache(reserve)
        # Per layer, the (keys, values) of the whole batch: views of the final cache's own buffers
        # where it has them (no second copy), else tensors handed to the layer at the end.
        targets: list[tuple[torch.Tensor, torch.Tensor]] = []
        logits = None
        for idx in groups:
            start = width - max(real[i] for i in idx)
            if end <= start:
                continue  # nothing of this group is run now (upto: the caller feeds the last token)
            rows = torch.tensor(idx, device=input_ids.device)
            cache = _with_prefix(DynamicCache(config=self.model.config), prefix, len(idx))
            sub_mask = torch.cat([mask[rows, :plen], mask[rows, start:end]], dim=1)
            out = self._forward(
                input_ids[rows, start:end], sub_mask, position_ids[rows, start:end], cache, keep
            )
            if not targets:
                for layer, got in zip(final.layers, cache.layers, strict=True):
                    if isinstance(layer, _GrowingLayer):
                        layer.allocate(got.keys, batch, end)
                        kv = (layer.keys, layer.values)
                    else:
                        kv = tuple(
                            t.new_empty((batch, t.shape[1], end, t.shape[3]))
                            for t in (got.keys, got.values)
                        )
                    for t, src in zip(kv, (got.keys, got.values), strict=True):
                        # Padding must be finite zeros: masked keys still enter q.k before the mask.
                        t[:, :, plen:].zero_()
                        if plen:
                            t[:, :, :plen] = src[:1, :, :plen]
                    targets.append(kv)
                logits = out.new_zeros((batch, keep, out.shape[-1]))
            for (kf, vf), layer in zip(targets, cache.layers, strict=True):
                kf[rows, :, start:end] = layer.keys[:, :, plen:]
                vf[rows, :, start:end] = layer.values[:, :, plen:]
            # A group narrower than ``keep`` returns fewer columns; rows are right-aligned, and the
            # columns it lacks lie in that group's padding, which no caller reads.
            logits[rows, keep - out.shape[1] :] = out
        if not targets:  # no group ran: the cache holds the prefix only, as in one big pass
            return _with_prefix(final, prefix, batch), logits
        for layer, (k, v) in zip(final.layers, targets, strict=True):
            if not isinstance(layer, _GrowingLayer):
                layer.update(k, v)
        return final, logits

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        prompts: Sequence[str],
        config: GenerationConfig | None = None,
        *,
        batch_size: int | None = None,
        progress: bool = False,
    ) -> list[list[Generation]]:
        config = config or GenerationConfig.greedy()
        encoded = self._encode(prompts)
        rows_per_batch = batch_size or self.batch_size
        prompts_per_batch = max(1, rows_per_batch // config.num_sequences)
        # Longest first: similar lengths share a batch (little padding) and memory peaks show early.
        order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
        results: list[list[Generation] | None] = [None] * len(encoded)
        batches = pack_batches(
            [len(encoded[i]) for i in order],
            max_prompts=prompts_per_batch,
            rows_per_prompt=config.num_sequences,
            extra=config.max_new_tokens,
            max_tokens=self.max_batch_tokens,
        )
        batches = [[order[j] for j in b] for b in batches]
        # The few-shot block that every prompt of an evaluation chunk repeats is computed once here.
        prefix = self._shared_prefix(encoded)
        for b, batch in enumerate(_progress(batches, progress, f"{self.name} {config.strategy}")):
            rows = [encoded[i] for i in batch]
            use = prefix if self._prefix_usable(prefix, rows, config.max_new_tokens) else None
            if config.strategy == "beam" or not self._fast_decode:
                outs = self._generate_batch_hf(rows, config, batch_index=b, prefix=use)
            else:
                outs = self._decode_batch(rows, batch, config, use)
            for i, gens in zip(batch, outs, strict=True):
                results[i] = gens
        return results  # type: ignore[return-value]

    def _uniforms(self, config: GenerationConfig, prompt_index: list[int]) -> torch.Tensor:
        """One seeded uniform per (row, step): sample j of prompt i depends on (seed, i, j) only."""
        seed = config.seed if config.seed is not None else 0
        n = config.num_sequences
        streams = [
            np.random.default_rng([seed, i, j]).random(config.max_new_tokens)
            for i in prompt_index
            for j in range(n)
        ]
        # float32 keeps u * total strictly below the CDF's last entry (see _decode_batch).
        return torch.from_numpy(np.minimum(np.stack(streams), 1 - 2**-22)).float()

    @torch.inference_mode()
    def _decode_batch(
        self,
        batch: list[list[int]],
        prompt_index: list[int],
        config: GenerationConfig,
        prefix: _Prefix | None,
    ) -> list[list[Generation]]:
        """Greedy decoding or sampling of one batch with gnll's loop (see the module docstring)."""
        n = config.num_sequences
        sampling = config.strategy == "sample"
        tau = config.temperature if sampling else 1.0
        stop_ids = self._stop_token_ids(config.stop)
        stop_set = set(stop_ids.tolist())
        multi = tuple(s for s in config.stop if len(s) > 1)
        window = max((len(s) for s in multi), default=0) + 1

        pre = self._prefill(batch, prefix, reserve=config.max_new_tokens)
        cache, mask = pre.cache, pre.attention_mask
        logits = pre.logits[:, -1]
        next_pos = pre.position_ids[:, -1] + 1
        if n > 1:
            # The prompt was prefilled once per prompt; its N samples share copies of that cache.
            cache.batch_repeat_interleave(n)
            mask = mask.repeat_interleave(n, dim=0)
            logits = logits.repeat_interleave(n, dim=0)
            next_pos = next_pos.repeat_interleave(n, dim=0)
        rows = len(batch) * n
        uniforms = self._uniforms(config, prompt_index) if sampling else None
        # Batch row -> output row; -1 marks a finished row still in the batch (see COMPACT_FRACTION).
        live = list(range(rows))
        alive = rows
        tokens: list[list[int]] = [[] for _ in range(rows)]
        raw: list[list[float]] = [[] for _ in range(rows)]
        tempered: list[list[float]] = [[] for _ in range(rows)]

        for step in range(config.max_new_tokens):
            lse = torch.logsumexp(logits, dim=-1)
            if sampling:
                scaled = logits / tau if tau != 1.0 else logits
                lse_t = torch.logsumexp(scaled, dim=-1) if tau != 1.0 else lse
                cdf = torch.exp(scaled - lse_t[:, None]).cumsum_(dim=-1)
                # Inverse CDF: first token whose cumulative mass exceeds u * total. u < 1 - 2^-22 keeps
                # the target below the total, and a zero-probability token can never be picked.
                u = uniforms[torch.tensor([max(r, 0) for r in live]), step].to(cdf.device)
                target = (u * cdf[:, -1])[:, None]
                chosen = torch.searchsorted(cdf, target, right=True)[:, 0]
                chosen.clamp_(max=cdf.shape[1] - 1)
            else:
                chosen = logits.argmax(dim=-1)
            chosen_logit = logits.gather(1, chosen[:, None])[:, 0]
            # One host transfer per step for ids and log-probs together.
            lp = (chosen_logit - lse).tolist()
            lpt = (chosen_logit / tau - lse_t).tolist() if sampling and tau != 1.0 else None
            ids = chosen.tolist()
            done: list[int] = []
            for j, r in enumerate(live):
                if r < 0:
                    continue
                tokens[r].append(ids[j])
                raw[r].append(lp[j])
                if lpt is not None:
                    tempered[r].append(lpt[j])
                if ids[j] in stop_set:
                    done.append(j)
            if multi:
                # Stop strings that span tokens ("Question:"): decode only the tail of live rows.
                finished = set(done)
                cand = [j for j, r in enumerate(live) if r >= 0 and j not in finished]
                if cand:
                    tails = self.tokenizer.batch_decode([tokens[live[j]][-window:] for j in cand])
                    done += [
                        j for j, t in zip(cand, tails, strict=True) if any(s in t for s in multi)
                    ]
            alive -= len(done)
            if alive == 0 or step + 1 == config.max_new_tokens:
                break
            for j in done:
                live[j] = -1
            if len(live) - alive >= max(1, alive * COMPACT_FRACTION):
                # Finished rows leave the batch and the cache: later steps cost only live rows.
                keep = [j for j, r in enumerate(live) if r >= 0]
                idx = torch.tensor(keep, device=mask.device)
                cache.batch_select_indices(idx)
                mask, next_pos, chosen = mask[idx], next_pos[idx], chosen[idx]
                live = [live[j] for j in keep]
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
            logits = self._forward(chosen[:, None], mask, next_pos[:, None], cache, keep=1)[:, -1]
            next_pos = next_pos + 1

        gens = [
            self._parse(
                tokens[r],
                np.asarray(raw[r]),
                np.asarray(tempered[r]) if sampling and tau != 1.0 else None,
                config,
                stop_set,
            )
            for r in range(rows)
        ]
        return [gens[i * n : (i + 1) * n] for i in range(len(batch))]

    @torch.inference_mode()
    def _generate_batch_hf(
        self,
        batch: list[list[int]],
        config: GenerationConfig,
        *,
        batch_index: int,
        prefix: _Prefix | None = None,
    ) -> list[list[Generation]]:
        """One batch through ``model.generate``: beam search, and models the fast loop cannot drive."""
        n = config.num_sequences
        kwargs: dict[str, Any] = {}
        if self._fast_decode:
            # Prefill the prompts once (the shared prefix once per call) and let every beam start from
            # a copy of that cache; generate() then only runs each prompt's last token.
            pre = self._prefill(batch, prefix, upto=1, reserve=config.max_new_tokens + 1)
            if n > 1:
                pre.cache.batch_repeat_interleave(n)
            inputs = {"input_ids": pre.input_ids, "attention_mask": pre.attention_mask}
            kwargs["past_key_values"] = pre.cache
        else:
            inputs = self.tokenizer.pad({"input_ids": batch}, return_tensors="pt").to(self.device)
        prompt_len = inputs["input_ids"].shape[1]
        stop_ids = self._stop_token_ids(config.stop)
        strategy_args: dict[str, Any] = {}
        if config.strategy == "sample":
            # Pure multinomial sampling: no top-k/top-p truncation; temperature is applied by the recorder.
            strategy_args = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
        elif config.strategy == "beam":
            # Rank beams by their raw log-likelihood, the quantity the MSP estimate needs.
            strategy_args = {"num_beams": n, "length_penalty": 0.0}
        hf_config = HFGenerationConfig(
            max_new_tokens=config.max_new_tokens,
            num_return_sequences=n,
            eos_token_id=stop_ids.tolist(),
            pad_token_id=self.tokenizer.pad_token_id,
            return_dict_in_generate=True,
            **strategy_args,
        )
        recorder = None
        if config.strategy != "beam":
            recorder = _LogprobRecorder(config.temperature, stop_ids)
            kwargs["logits_processor"] = LogitsProcessorList([recorder])
            multi_token = tuple(st for st in config.stop if len(st) > 1)
            if multi_token:
                kwargs["stopping_criteria"] = StoppingCriteriaList(
                    [_StopStrings(self.tokenizer, multi_token, prompt_len)]
                )
        if config.strategy == "sample":
            seed = (config.seed if config.seed is not None else 0) * 1_000_003 + batch_index
            torch.manual_seed(seed)
        out = self.model.generate(**inputs, generation_config=hf_config, **kwargs)
        new_tokens = out.sequences[:, prompt_len:]
        raw = tempered = None
        if recorder is not None:
            recorder.finish(new_tokens[:, -1])
            raw, tempered = recorder.stacked()
            if raw.shape[1] != new_tokens.shape[1]:
                raise RuntimeError(
                    f"internal error: recorded {raw.shape[1]} log-probs for {new_tokens.shape[1]} tokens"
                )
        stop_set = set(stop_ids.tolist())
        gens: list[Generation] = []
        for r in range(new_tokens.shape[0]):
            ids = new_tokens[r].tolist()
            gens.append(
                self._parse(
                    ids,
                    raw[r] if raw is not None else None,
                    tempered[r] if tempered is not None else None,
                    config,
                    stop_set,
                )
            )
        if config.strategy == "beam":
            self._score_beams(batch, gens, n, config)
        return [gens[i * n : (i + 1) * n] for i in range(len(batch))]

    def _parse(
        self,
        ids: list[int],
        raw: np.ndarray | None,
        tempered: np.ndarray | None,
        config: GenerationConfig,
        stop_set: set[int],
    ) -> Generation:
        """Split generated ids into answer and terminator, cutting at the first stop string or EOS."""
        # Everything after the first stop/EOS token is padding.
        end = next((t + 1 for t, i in enumerate(ids) if i in stop_set), len(ids))
        ids = ids[:end]
        eos_at = next((t for t, i in enumerate(ids) if i in self._eos_ids), None)
        body = ids[:eos_at] if eos_at is not None else ids
        text = self.tokenizer.decode(body)
        hits = [(text.find(s), s) for s in config.stop if s in text]
        if hits:
            cut, stop_seq = min(hits)
            finish = "stop"
            # Answer tokens: those whose text lies entirely before the stop string.
            k = 0
            while k < len(body) and len(self.tokenizer.decode(body[: k + 1])) <= cut:
                k += 1
            term_end = k + 1
            while term_end < len(body) and len(self.tokenizer.decode(body[:term_end])) < cut + len(
                stop_seq
            ):
                term_end += 1
            term_end = min(term_end, len(body))
        elif eos_at is not None:
            cut, stop_seq, finish = len(text), None, "eos"
            k, term_end = eos_at, eos_at + 1
        else:
            cut, stop_seq, finish = len(text), None, "length"
            k, term_end = len(ids), len(ids)
        answer_ids, term_ids = ids[:k], ids[k:term_end]
        lp = [] if raw is None else raw[: len(ids)].tolist()
        token_lp, term_lp = lp[:k], lp[k:term_end]
        if config.include_terminator:
            token_lp = token_lp + term_lp
        sampling = None
        if config.strategy == "sample":
            sampling = (tempered[:k] if tempered is not None else raw[:k]).tolist()
        return Generation(
            text=text[:cut].strip(),
            token_ids=answer_ids,
            tokens=self._token_strings(answer_ids),
            token_logprobs=token_lp,
            finish_reason=finish,
            stop_sequence=stop_seq,
            terminator_token_ids=term_ids,
            terminator_logprobs=term_lp,
            sampling_logprobs=sampling,
        )

    def _score_beams(
        self, batch: list[list[int]], gens: list[Generation], n: int, config: GenerationConfig
    ) -> None:
        conts = [g.token_ids + g.terminator_token_ids for g in gens]
        prompt_ids = [batch[i // n] for i in range(len(gens))]
        scored = self._score_ids(prompt_ids, conts)
        for g, lp in zip(gens, scored, strict=True):
            k = len(g.token_ids)
            g.terminator_logprobs = lp[k:].tolist()
            g.token_logprobs = lp[: k + (len(lp) - k if config.include_terminator else 0)].tolist()
        # Best first by the quantity reported (transformers ranks with the terminator included).
        for start in range(0, len(gens), n):
            gens[start : start + n] = sorted(gens[start : start + n], key=lambda g: -g.logprob)

    # ------------------------------------------------------------------ scoring
    def score(
        self, prompts: Sequence[str], continuations: Sequence[Sequence[int]]
    ) -> list[np.ndarray]:
        """Teacher-forced ``log p(c_t | prompt, c_<t)`` for each continuation (token ids), float64.

        Examples
        --------
        >>> from gnll import load_model
        >>> model = load_model("smollm2-135m-instruct", progress=False)
        >>> [[g]] = model.generate(["Capital of France?"])
        >>> bool(np.allclose(model.score(["Capital of France?"], [g.token_ids])[0], g.token_logprobs,
        ...                  atol=1e-4))
        True
        """
        if len(prompts) != len(continuations):
            raise ValueError(
                f"got {len(prompts)} prompts but {len(continuations)} continuations; pass one each"
            )
        return self._score_ids(self._encode(prompts), [list(c) for c in continuations])

    @torch.inference_mode()
    def _score_ids(self, prompt_ids: list[list[int]], conts: list[list[int]]) -> list[np.ndarray]:
        out: list[np.ndarray] = [np.zeros(0)] * len(conts)
        todo = [i for i in range(len(conts)) if conts[i]]
        if not todo:
            return out
        order = sorted(todo, key=lambda i: -(len(prompt_ids[i]) + len(conts[i])))
        seqs = {i: list(prompt_ids[i]) + list(conts[i]) for i in todo}
        if self._fast_decode:
            # Beams of one prompt and the prompts of a task share most of their tokens: run those
            # once. The prefix must end before each prompt's last token, whose logits score c_1.
            cap = min(len(prompt_ids[i]) for i in todo) - 1
            prefix = self._shared_prefix([seqs[i] for i in todo], cap=cap)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            rows = [seqs[i] for i in idx]
            keep = max(len(conts[i]) for i in idx) + 1
            if self._fast_decode:
                use = prefix if self._prefix_usable(prefix, rows, 0) else None
                logits = self._prefill(rows, use, keep=keep).logits
            else:
                inputs = self.tokenizer.pad({"input_ids": rows}, return_tensors="pt").to(
                    self.device
                )
                kwargs = {"logits_to_keep": keep} if self._supports_logits_to_keep else {}
                logits = self.model(**inputs, **kwargs).logits[:, -keep:].float()
            # logsumexp + gather instead of a full log_softmax: no second rows x keep x vocab tensor.
            lse = torch.logsumexp(logits, dim=-1)
            for row, i in enumerate(idx):
                c = len(conts[i])
                # Rows are right-aligned; position -1 of `logits` predicts nothing we need.
                pos = torch.arange(keep - 1 - c, keep - 1, device=logits.device)
                tok = torch.tensor(conts[i], device=logits.device)
                lp = logits[row, pos, tok] - lse[row, pos]
                out[i] = lp.double().cpu().numpy()
        return out


def load_tokenizer_json(directory: str | os.PathLike[str]) -> PreTrainedTokenizerFast:
    """A fast tokenizer built directly from ``directory``'s ``tokenizer.json`` and special tokens.

    ``AutoTokenizer`` in transformers 5 re-parses ``tokenizer.json`` in Python and rebuilds
    model-specific tokenizer classes: 4.6 s for Gemma-3's 262k vocabulary, against 2 s for the
    Rust parser alone. Only for checkpoints whose ``tokenizer.json`` is the whole tokenizer (true
    for gnll's converted embedded models; ``tests/test_backend_hf.py`` checks equal token ids).
    """
    from tokenizers import Tokenizer

    root = Path(directory)
    config_file = root / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    special = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}
    template = config.get("chat_template")
    if template is None and (root / "chat_template.jinja").exists():
        template = (root / "chat_template.jinja").read_text()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(root / "tokenizer.json")), **special
    )
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


def _stop_vocab_ids(tokenizer: PreTrainedTokenizerBase, stop: tuple[str, ...]) -> list[int]:
    """Ids of vocabulary entries whose decoded text contains any stop string (disk-cached)."""
    import hashlib
    import json

    from gnll.backends.registry import cache_dir

    vocab = tokenizer.get_vocab()
    key = hashlib.sha256(
        json.dumps([type(tokenizer).__name__, sorted(vocab.items()), list(stop)]).encode()
    ).hexdigest()[:24]
    path = cache_dir() / "stop-ids" / f"{key}.json"
    if path.exists():
        return json.loads(path.read_text())
    strings = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    ids = [i for i, text in enumerate(strings) if any(st in text for st in stop)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(ids))
    tmp.replace(path)
    return ids


def _resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    try:
        return getattr(torch, dtype)
    except AttributeError as exc:
        raise ValueError(
            f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16"
        ) from exc


def _progress(items: list, enabled: bool, desc: str) -> Iterator:
    if not enabled or len(items) <= 1:
        yield from items
        return
    from tqdm.auto import tqdm

    yield from tqdm(
        items, desc=desc, unit="batch", disable=os.environ.get("GNLL_NO_PROGRESS") == "1"
    )
