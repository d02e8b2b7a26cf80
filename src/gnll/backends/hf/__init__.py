"""The transformers backend: batched generation with exact token log-probabilities.

Greedy decoding and sampling run gnll's own decoding loop on the model's forward pass (KV cache, left
padding), because that makes savings possible that ``model.generate`` cannot offer:

* **log-probs in the same pass** -- each step's raw logits are already at hand for choosing the token,
  so ``log_softmax(raw_logits)[chosen]`` is one ``logsumexp`` and one gather; no logits processor,
  no extra copy, nothing of size steps x vocab is stored;
* **continuous batching** -- a row that hit a stop token frees its slot and a waiting prompt takes
  it (its prompt prefilled and written into the running cache); when nothing waits, finished rows
  leave the batch and the KV cache, so a batch costs what its live rows cost, not ``rows x longest
  answer``. Prompts can also join while the loop runs (:meth:`~.model.HFModel.open_decoder`: servers);
* **no repeated prompt work** -- the prompt tokens that all prompts of a call share (the instruction
  and few-shot examples of an evaluation task) are run through the model once and their KV cache is
  reused by every row; the N samples of one prompt prefill the prompt once and copy its cache N times;
* **no cache re-concatenation** -- full-attention layers append to a buffer in place
  (:class:`~.kv_cache.GrowingLayer`) instead of ``torch.cat``-ing the whole cache at every step.

Samples are drawn by inverse-CDF sampling with one seeded uniform stream per (prompt, sample), so
sample j of a prompt depends on the seed, the prompt and j only (:func:`~gnll._util.seeds.sample_seed`),
not on the batch it shares -- up to floating-point noise: a batch of other lengths pads the prompt
differently, which moves its logits by ~1e-5, and at temperature 1 a uniform that falls that close
to a boundary of the CDF picks the neighbouring token (rare per token, but a long sample can part).
Beam search runs in the same loop (:mod:`.beam`): transformers' search, with each prompt prefilled
once and dropped from the batch when it is done. Models whose cache is not a plain attention KV cache (recurrent
or chunked-attention layers) use ``model.generate`` with a logits processor that chooses the tokens
with the same code as the loop and records their log-probs.

The package, one concern per module: :mod:`.loading` (checkpoint, tokenizer, chat template),
:mod:`.planning` (batches, prefill groups), :mod:`.kv_cache`, :mod:`.prefill`, :mod:`.selection`
(token choice, log-probs, seeding), :mod:`.stopping`, :mod:`.decode` (the loop), :mod:`.beam`
(beam search in the loop), :mod:`.hf_generate`
(the ``model.generate`` path) and :mod:`.scoring` (teacher forcing). :class:`~.model.HFModel` in
:mod:`.model` ties them together; importing this package registers it as the ``"hf"`` backend.
"""

from __future__ import annotations

from typing import Any

from gnll.backends.hf.decode import Decoder
from gnll.backends.hf.loading import load_tokenizer_json
from gnll.backends.hf.model import HFModel
from gnll.backends.hf.planning import (
    COMPACT_FRACTION,
    FORWARD_COST_POSITIONS,
    MIN_SHARED_PREFIX,
    pack_batches,
    prefill_groups,
)
from gnll.backends.hf.tokenizer_side import tokenizer_side
from gnll.backends.identity import local_identity
from gnll.backends.model_args import HFModelArgs
from gnll.backends.registry import register_backend

__all__ = [
    "COMPACT_FRACTION",
    "FORWARD_COST_POSITIONS",
    "MIN_SHARED_PREFIX",
    "Decoder",
    "HFModel",
    "load_hf",
    "load_tokenizer_json",
    "pack_batches",
    "prefill_groups",
]


@register_backend(
    "hf",
    targets=(HFModel.from_pretrained, HFModel),
    model_args=HFModelArgs,
    identity=local_identity,
    tokenizer_side=tokenizer_side,
)
def load_hf(name: str, *, progress: bool = True, **model_args: Any) -> HFModel:
    """An embedded model (converted and cached on first use), a hub id or a local checkpoint."""
    from gnll.backends.embedded import EMBEDDED_MODELS, embedded_model_dir, loading_status

    if name in EMBEDDED_MODELS:
        spec = EMBEDDED_MODELS[name]
        path = embedded_model_dir(spec, progress=progress)
        model_args.setdefault("chat_template", spec.instruction_tuned)
        model_args.setdefault("fast_tokenizer", True)
        with loading_status(f"Loading {name}", progress, quiet_transformers=True):
            return HFModel.from_pretrained(str(path), name=name, **model_args)
    with loading_status(f"Loading {name}", progress):
        return HFModel.from_pretrained(name, **model_args)
