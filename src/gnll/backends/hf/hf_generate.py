"""The transformers ``model.generate`` path: beam search, and models gnll's loop cannot drive.

For greedy decoding and sampling, a logits processor (:class:`ChooseAndRecord`) chooses every
token itself with the same code and the same per-sample uniforms as gnll's loop and records its
log-probs; ``generate`` then only takes the one token left possible. So both paths give the same
samples for the same seed. Beam search is transformers' own; its beams are scored afterwards by
one teacher-forced pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from transformers import GenerationConfig as HFGenerationConfig
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteriaList,
)

from gnll.backends.base import Generation, GenerationConfig
from gnll.backends.hf.kv_cache import Prefix
from gnll.backends.hf.prefill import Prefiller, left_padded, pad_token_id
from gnll.backends.hf.selection import StepScores, sample_uniforms
from gnll.backends.hf.stopping import StopRules, StopStringCriteria

#: Teacher-forced scorer: (prompt ids, continuation ids) -> log-probs of each continuation.
Scorer = Callable[[list[list[int]], list[list[int]]], list[np.ndarray]]


class ChooseAndRecord(LogitsProcessor):
    """Chooses each row's token (argmax, or inverse CDF on the row's uniforms) and records its log-probs.

    It must be the only logits processor, so ``scores`` are the model's raw float32 logits. The
    returned scores are ``-inf`` except at the chosen token, which greedy ``generate`` then takes.
    Rows that already emitted a stop token only receive padding; skipping them keeps the cost
    proportional to the live rows.
    """

    def __init__(
        self, temperature: float, uniforms: torch.Tensor | None, stop_ids: torch.Tensor
    ) -> None:
        self.temperature = temperature
        self.uniforms = uniforms
        self.stop_ids = stop_ids
        self.raw: list[torch.Tensor] = []
        self.tempered: list[torch.Tensor] = []
        self._active: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows, step = scores.shape[0], len(self.raw)
        if self._active is None:
            self._active = torch.ones(rows, dtype=torch.bool, device=scores.device)
        raw = scores.new_zeros(rows)
        tempered = scores.new_zeros(rows) if self.temperature != 1.0 else None
        forced = torch.full_like(scores, float("-inf"))
        idx = self._active.nonzero(as_tuple=True)[0]
        if idx.numel():
            step_scores = StepScores(
                scores if idx.numel() == rows else scores.index_select(0, idx), self.temperature
            )
            if self.uniforms is None:
                chosen = step_scores.greedy()
            else:
                chosen = step_scores.sample(self.uniforms[idx.cpu(), step])
            lp, lpt = step_scores.logprobs(chosen)
            raw[idx] = lp
            if tempered is not None:
                tempered[idx] = lpt
            forced[idx, chosen] = 0.0
            self._active[idx] = ~torch.isin(chosen, self.stop_ids)
        self.raw.append(raw)
        if tempered is not None:
            self.tempered.append(tempered)
        return forced

    def stacked(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Recorded log-probs as ``rows x steps`` float64 arrays (raw, tempered or ``None``)."""
        raw = torch.stack(self.raw, dim=1).double().cpu().numpy()
        tempered = (
            torch.stack(self.tempered, dim=1).double().cpu().numpy() if self.tempered else None
        )
        return raw, tempered


#: What gnll keeps of a checkpoint's own ``generation_config``: the special token ids.
_KEEP = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def neutralise_generation_config(model: PreTrainedModel) -> dict[str, Any]:
    """Replace ``model.generation_config`` by a neutral one; return the settings it dropped.

    transformers' ``generate`` fills every field a call leaves unset from the checkpoint's
    ``generation_config.json``, which can switch on sampling, top-k/top-p or a repetition penalty
    (processors that would run before gnll's log-prob recorder). gnll sets every decoding choice
    itself, so only the special token ids survive.
    """
    original = getattr(model, "generation_config", None)
    if original is None:
        return {}
    dropped = {
        k: v
        for k, v in original.to_diff_dict().items()
        if k not in _KEEP and not k.startswith("transformers_version") and not k.startswith("_")
    }
    keep = {k: getattr(original, k) for k in _KEEP if getattr(original, k, None) is not None}
    model.generation_config = HFGenerationConfig(**keep)
    return dropped


@torch.inference_mode()
def generate_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    batch: list[list[int]],
    config: GenerationConfig,
    stops: StopRules,
    *,
    engine: Prefiller | None,
    prefix: Prefix | None,
    scorer: Scorer,
) -> list[list[Generation]]:
    """One batch of encoded prompts through ``model.generate``; ``num_sequences`` per prompt.

    With an ``engine`` the prompts are prefilled by gnll (the shared prefix once) and ``generate``
    starts from that cache; without one, ``generate`` gets plainly padded prompts.
    """
    n = config.num_sequences
    beam = config.strategy == "beam"
    kwargs: dict[str, Any] = {}
    if engine is not None:
        # Prefill once per prompt (the shared prefix once per call) and let every beam or sample
        # start from a copy of that cache; generate() then only runs each prompt's last token.
        pre = engine.prefill(batch, prefix, upto=1, reserve=config.max_new_tokens + 1)
        if n > 1:
            pre.cache.batch_repeat_interleave(n)
        input_ids, mask = pre.input_ids, pre.attention_mask
        kwargs[engine.cache_arg] = pre.cache
    else:
        input_ids, mask = left_padded(batch, pad_token_id(tokenizer), model.device)
    prompt_len = input_ids.shape[1]
    chooser = None
    if beam:
        # Rank beams by their raw log-likelihood, the quantity the MSP estimate needs.
        strategy: dict[str, Any] = {
            "num_beams": n,
            "num_return_sequences": n,
            "length_penalty": 0.0,
        }
    else:
        # The N rows of a prompt are laid out here, so that row i*N+j is sample j of prompt i.
        input_ids, mask = input_ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
        uniforms = None
        if config.strategy == "sample":
            uniforms = sample_uniforms(config.seed, batch, n, config.max_new_tokens)
        tau = config.temperature if config.strategy == "sample" else 1.0
        chooser = ChooseAndRecord(tau, uniforms, stops.ids)
        strategy = {"do_sample": False}
        kwargs["logits_processor"] = LogitsProcessorList([chooser])
        if stops.strings:
            kwargs["stopping_criteria"] = StoppingCriteriaList(
                [StopStringCriteria(stops, prompt_len)]
            )
    hf_config = HFGenerationConfig(
        max_new_tokens=config.max_new_tokens,
        eos_token_id=stops.ids.tolist(),
        pad_token_id=pad_token_id(tokenizer),
        return_dict_in_generate=True,
        **strategy,
    )
    out = model.generate(
        input_ids=input_ids, attention_mask=mask, generation_config=hf_config, **kwargs
    )
    new_tokens = out.sequences[:, prompt_len:].tolist()
    raw = tempered = None
    if chooser is not None:
        raw, tempered = chooser.stacked()
        if raw.shape[1] != len(new_tokens[0]):
            raise RuntimeError(
                f"internal error: recorded {raw.shape[1]} log-probs for {len(new_tokens[0])} tokens"
            )
    gens = [
        stops.split(
            ids,
            raw[r] if raw is not None else None,
            tempered[r] if tempered is not None else None,
            config,
        )
        for r, ids in enumerate(new_tokens)
    ]
    if beam:
        gens = rescore_beams(batch, gens, n, config, scorer)
    return [gens[i * n : (i + 1) * n] for i in range(len(batch))]


def rescore_beams(
    batch: list[list[int]],
    gens: list[Generation],
    n: int,
    config: GenerationConfig,
    scorer: Scorer,
) -> list[Generation]:
    """Beams with exact teacher-forced log-probs, best first by the quantity reported.

    transformers ranks beams with the terminator included and reports no per-token log-probs.
    """
    conts = [g.token_ids + g.terminator_token_ids for g in gens]
    scored = scorer([batch[i // n] for i in range(len(gens))], conts)
    out = []
    for g, lp in zip(gens, scored, strict=True):
        k = len(g.token_ids)
        answer = lp if config.include_terminator else lp[:k]
        out.append(replace(g, token_logprobs=answer.tolist(), terminator_logprobs=lp[k:].tolist()))
    for start in range(0, len(out), n):
        out[start : start + n] = sorted(out[start : start + n], key=lambda g: -g.logprob)
    return out
