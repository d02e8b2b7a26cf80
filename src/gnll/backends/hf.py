"""The transformers backend: batched generation with exact token log-probabilities.

How the log-probs are obtained without slowing generation down: a logits processor sees each step's raw
logits (the copy `generate` makes anyway) and keeps a reference to them; on the *next* step the chosen
token is known (it is the last input id), so one gather and one logsumexp over the still-active rows
give ``log_softmax(raw_logits)[chosen]``. Nothing of size steps x vocab is ever stored. Beam search
reorders its rows between steps, so its outputs are scored afterwards by one teacher-forced pass.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from functools import cached_property
from typing import Any

import numpy as np
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers import GenerationConfig as HFGenerationConfig

from gnll.backends.base import Generation, GenerationConfig, Model

logger = logging.getLogger(__name__)

# Substrings that mark instruction-tuned checkpoints when the caller does not say (chat_template="auto").
_INSTRUCT_MARKERS = ("instruct", "-it", "_it", "chat", "-sft", "dpo")


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
    source:
        Where the weights came from, recorded by :meth:`info`.

    Examples
    --------
    >>> from gnll import load_model, GenerationConfig  # doctest: +SKIP
    >>> model = load_model("smollm2-135m-instruct")  # doctest: +SKIP
    >>> [[gen]] = model.generate(["What is the capital of France?"])  # doctest: +SKIP
    >>> gen.text, gen.token_logprobs  # doctest: +SKIP
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        name: str,
        chat_template: bool | None = None,
        batch_size: int = 16,
        source: str | None = None,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.batch_size = int(batch_size)
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
        **kwargs: Any,
    ) -> HFModel:
        """Load any Hugging Face hub id or local directory (optionally a GGUF file inside it)."""
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        torch_dtype = _resolve_dtype(dtype, device)
        common = {"revision": revision, "trust_remote_code": trust_remote_code}
        if gguf_file:
            common["gguf_file"] = gguf_file
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
        batches = [
            order[i : i + prompts_per_batch] for i in range(0, len(order), prompts_per_batch)
        ]
        for b, batch in enumerate(_progress(batches, progress, f"{self.name} {config.strategy}")):
            outs = self._generate_batch([encoded[i] for i in batch], config, batch_index=b)
            for i, gens in zip(batch, outs, strict=True):
                results[i] = gens
        return results  # type: ignore[return-value]

    @torch.inference_mode()
    def _generate_batch(
        self, batch: list[list[int]], config: GenerationConfig, *, batch_index: int
    ) -> list[list[Generation]]:
        inputs = self.tokenizer.pad({"input_ids": batch}, return_tensors="pt").to(self.device)
        prompt_len = inputs["input_ids"].shape[1]
        stop_ids = self._stop_token_ids(config.stop)
        n = config.num_sequences
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
        kwargs: dict[str, Any] = {}
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
                    raw[r] if recorder is not None else None,
                    tempered[r] if recorder is not None and tempered is not None else None,
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
        >>> [[g]] = model.generate(["Capital of France?"])  # doctest: +SKIP
        >>> model.score(["Capital of France?"], [g.token_ids])[0]  # == g.token_logprobs  # doctest: +SKIP
        """
        if len(prompts) != len(continuations):
            raise ValueError(
                f"got {len(prompts)} prompts but {len(continuations)} continuations; pass one each"
            )
        return self._score_ids(self._encode(prompts), [list(c) for c in continuations])

    @torch.inference_mode()
    def _score_ids(self, prompt_ids: list[list[int]], conts: list[list[int]]) -> list[np.ndarray]:
        out: list[np.ndarray] = [np.zeros(0)] * len(conts)
        order = sorted(range(len(conts)), key=lambda i: -(len(prompt_ids[i]) + len(conts[i])))
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            seqs = [prompt_ids[i] + conts[i] for i in idx]
            keep = max(len(conts[i]) for i in idx) + 1
            if keep == 1:
                continue
            inputs = self.tokenizer.pad({"input_ids": seqs}, return_tensors="pt").to(self.device)
            # Only the last `keep` positions' logits are needed: avoids a seq x vocab tensor per row.
            logits = self.model(**inputs, logits_to_keep=keep).logits.float()
            logp = torch.log_softmax(logits, dim=-1)
            for row, i in enumerate(idx):
                c = len(conts[i])
                if c == 0:
                    continue
                # Left padding right-aligns every row; position -1 of `logp` predicts nothing we need.
                pos = torch.arange(keep - 1 - c, keep - 1)
                tok = torch.tensor(conts[i])
                out[i] = logp[row, pos, tok].double().cpu().numpy()
        return out


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
