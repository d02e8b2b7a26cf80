"""Beam search in gnll's own loop: the beams of transformers' beam search, without its overheads.

The search is transformers' (``num_beams=K``, ``length_penalty=0``, ``early_stopping=False``): at
every step each prompt's K running beams are extended by every token; a stop token among the K
best extensions finishes a hypothesis (kept if it is among the K best finished so far), the K best
extensions by a non-stop token run on; a prompt is done when all K finished slots are filled and
its best running beam scores no higher than its worst finished one. What differs is the cost:

- the prompt is prefilled once (the call's shared few-shot prefix once per call) and its cache
  repeated K times, instead of K padded prefills;
- a prompt that is done leaves the batch and the cache, where ``generate`` keeps decoding it until
  every prompt of the batch is done;
- candidates are chosen with two top-K selections over ``K x vocab`` scores, instead of a top-k of
  ``(1 + number of stop ids) x K`` (thousands, with every newline token a stop id);
- each beam's token log-probs are recorded as it grows, so no teacher-forced pass re-scores the
  returned beams.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache

from gnll.backends.base import Generation, GenerationConfig
from gnll.backends.hf.kv_cache import Prefix
from gnll.backends.hf.prefill import Prefiller
from gnll.backends.hf.stopping import StopRules

#: transformers' stand-in for minus infinity in beam scores (kept so ties and sums behave alike).
_NEG = -1.0e9


@dataclass
class _Prompt:
    """One prompt's search state: finished hypotheses and whether it can still improve."""

    finished: list[tuple[float, list[int], list[float]]] = field(default_factory=list)
    open: bool = True

    def offer(self, score: float, ids: list[int], lps: list[float], k: int) -> None:
        # transformers merges new finished candidates after the old ones and keeps the top K by
        # score (topk is stable for our purposes: earlier entries win ties).
        self.finished.append((score, ids, lps))
        self.finished.sort(key=lambda h: -h[0])
        del self.finished[k:]

    def improvable(self, best_running: float, k: int) -> bool:
        if len(self.finished) < k:
            return True
        return best_running > self.finished[-1][0]


def _reorder_in_place(cache: DynamicCache, idx: torch.Tensor) -> None:
    """``cache.batch_select_indices(idx)`` for a permutation-with-repeats of the same row count,
    copying only the rows whose beam changed (most beams keep their parent from step to step, and
    a full reorder copies every row's whole prompt)."""
    changed = (idx != torch.arange(len(idx), device=idx.device)).nonzero(as_tuple=True)[0]
    if not len(changed):
        return
    src = idx[changed]
    for layer in cache.layers:
        # keys/values are views of the layer's buffer (or plain tensors): written in place.
        layer.keys[changed] = layer.keys[src]
        layer.values[changed] = layer.values[src]


@torch.inference_mode()
def beam_search(
    engine: Prefiller,
    batch: list[list[int]],
    config: GenerationConfig,
    prefix: Prefix | None,
    stops: StopRules,
    *,
    on_done: Callable[[float], None] | None = None,
) -> list[list[Generation]]:
    """K-beam search of one batch of encoded prompts; the K finished beams per prompt, best first.

    Beams are ranked by the log-likelihood of their tokens including the terminator (as
    transformers ranks them) and returned best first by the answer's log-likelihood (the terminator
    excluded, the quantity the MSP estimate uses), each with its per-token log-probs.
    ``on_done`` hears of every prompt whose search ends.
    """
    k = config.num_sequences
    steps = config.max_new_tokens
    pre = engine.prefill(batch, prefix, reserve=steps)
    states = [_Prompt() for _ in batch]

    # Live rows: prompt index per block of K rows; per row its tokens, log-probs and score.
    live = list(range(len(batch)))
    logp = torch.log_softmax(pre.logits[:, -1].float(), dim=-1)  # prompts x vocab, beam 0 only
    vocab = logp.shape[-1]
    stop_mask = torch.zeros(vocab, dtype=torch.bool, device=logp.device)
    stop_mask[stops.ids[stops.ids < vocab]] = True
    cache, mask = pre.cache, pre.attention_mask
    next_pos = pre.position_ids[:, -1] + 1
    tokens: list[list[int]] = [[] for _ in batch]
    lps: list[list[float]] = [[] for _ in batch]
    scores = torch.zeros((len(batch), 1), dtype=torch.float32, device=logp.device)
    width = 1  # beams per live prompt in the current tensors (1 before the first step)

    for step in range(steps):
        last = step + 1 == steps
        p = len(live)
        total = (logp.view(p, width, vocab) + scores.view(p, width, 1)).view(p, width * vocab)
        top_val, top_idx = torch.topk(total, k)
        if last:
            run_val = run_idx = None
        else:
            run_val, run_idx = torch.topk(total.masked_fill(stop_mask.repeat(width), _NEG), k)
        flat_lp = logp.view(p, width * vocab)
        top_val_l, top_idx_l = top_val.tolist(), top_idx.tolist()
        top_lp = flat_lp.gather(1, top_idx).tolist()
        top_stop = stop_mask[top_idx % vocab].tolist()
        # Finished candidates: stop tokens among the K best extensions (every one at the last step).
        for b, pi in enumerate(live):
            st = states[pi]
            if not st.open:
                continue
            for j, flat in enumerate(top_idx_l[b]):
                if last or top_stop[b][j]:
                    beam, tok = divmod(flat, vocab)
                    row = b * width + beam
                    st.offer(top_val_l[b][j], tokens[row] + [tok], lps[row] + [top_lp[b][j]], k)
        if last:
            if on_done is not None:
                on_done(len(live))
            break
        run_val_l, run_idx_l = run_val.tolist(), run_idx.tolist()
        run_lp = flat_lp.gather(1, run_idx).tolist()
        # Prompts that cannot improve any more leave the batch.
        keep_blocks, new_tokens, new_lps, select, chosen = [], [], [], [], []
        for b, pi in enumerate(live):
            st = states[pi]
            st.open = st.open and st.improvable(run_val_l[b][0], k)
            if not st.open:
                if on_done is not None:
                    on_done(1)
                continue
            keep_blocks.append(b)
            for flat, lp in zip(run_idx_l[b], run_lp[b], strict=True):
                beam, tok = divmod(flat, vocab)
                row = b * width + beam
                select.append(row)
                chosen.append(tok)
                new_tokens.append(tokens[row] + [tok])
                new_lps.append(lps[row] + [lp])
        if not keep_blocks:
            break
        dev = logp.device
        kb = torch.tensor(keep_blocks, device=dev)
        scores = run_val[kb].reshape(-1)
        live = [live[b] for b in keep_blocks]
        idx = torch.tensor(select, device=dev)
        # Reorder the cache to the surviving beams (on the first step the prompt's single row
        # becomes K rows); rows of done prompts are not selected, so they leave the batch.
        if width == k and len(select) == mask.shape[0]:
            _reorder_in_place(cache, idx)
        else:
            cache.batch_select_indices(idx)
        mask, next_pos = mask[idx], next_pos[idx]
        width = k
        tokens, lps = new_tokens, new_lps
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        ids = torch.tensor(chosen, device=dev)[:, None]
        logits = engine.forward(ids, mask, next_pos[:, None], cache, 1)[:, -1]
        next_pos = next_pos + 1
        logp = torch.log_softmax(logits, dim=-1)

    out: list[list[Generation]] = []
    for st in states:
        gens = [
            stops.split(ids, np.asarray(lp, dtype=np.float64), None, config)
            for _, ids, lp in st.finished
        ]
        gens.sort(key=lambda g: -g.logprob)
        out.append(gens)
    return out
