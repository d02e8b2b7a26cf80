"""gnll's decoding loop: greedy decoding and sampling on the model's forward pass.

The loop itself (:func:`decode`) reads like any sampling loop -- choose a token, record its
log-probs, check for stops, run the model on the new token -- with each job in a small piece:
:class:`~.selection.StepScores` chooses and scores tokens, :class:`~.stopping.StopRules` says which
rows ended, :class:`LiveRows` keeps the batch, its mask and its cache, and drops finished rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from gnll.backends.base import Generation, GenerationConfig
from gnll.backends.hf.kv_cache import Prefix
from gnll.backends.hf.planning import COMPACT_FRACTION
from gnll.backends.hf.prefill import Prefilled, Prefiller
from gnll.backends.hf.selection import StepScores, sample_uniforms
from gnll.backends.hf.stopping import StopRules


class LiveRows:
    """The rows in the batch: which output row each one is, its mask, positions and KV cache.

    A finished row stays in the batch (costing one position per step) until finished rows make up
    :data:`~.planning.COMPACT_FRACTION` of the live ones; then all of them leave every tensor and
    the cache at once (one copy of the cache), so later steps cost only the live rows.
    """

    def __init__(self, pre: Prefilled, repeats: int) -> None:
        self.cache, self.mask = pre.cache, pre.attention_mask
        self.next_pos = pre.position_ids[:, -1] + 1
        if repeats > 1:
            # The prompt was prefilled once; its N samples share copies of that cache.
            self.cache.batch_repeat_interleave(repeats)
            self.mask = self.mask.repeat_interleave(repeats, dim=0)
            self.next_pos = self.next_pos.repeat_interleave(repeats, dim=0)
        self.out = list(range(self.mask.shape[0]))  # batch row -> output row
        self.done = [False] * len(self.out)
        self.alive = len(self.out)

    def running(self) -> list[int]:
        """Batch rows that have not finished."""
        return [j for j, d in enumerate(self.done) if not d]

    def finish(self, rows: Sequence[int]) -> None:
        for j in rows:
            self.done[j] = True
        self.alive -= len(rows)

    def step(self, engine: Prefiller, chosen: torch.Tensor) -> torch.Tensor:
        """Feed each row's chosen token to the model; the next step's logits (rows x vocab)."""
        if len(self.out) - self.alive >= max(1, self.alive * COMPACT_FRACTION):
            keep = self.running()
            idx = torch.tensor(keep, device=self.mask.device)
            self.cache.batch_select_indices(idx)
            self.mask, self.next_pos, chosen = self.mask[idx], self.next_pos[idx], chosen[idx]
            self.out = [self.out[j] for j in keep]
            self.done = [False] * len(keep)
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.out), 1))], dim=1)
        logits = engine.forward(chosen[:, None], self.mask, self.next_pos[:, None], self.cache, 1)
        self.next_pos = self.next_pos + 1
        return logits[:, -1]


@torch.inference_mode()
def decode(
    engine: Prefiller,
    batch: list[list[int]],
    config: GenerationConfig,
    prefix: Prefix | None,
    stops: StopRules,
    *,
    on_done: Callable[[float], None] | None = None,
) -> list[list[Generation]]:
    """Greedy decoding or sampling of one batch of encoded prompts; ``num_sequences`` per prompt.

    ``on_done`` hears how many prompts finished at each step (a finished sample counts 1/N).
    """
    n = config.num_sequences
    sampling = config.strategy == "sample"
    tau = config.temperature if sampling else 1.0
    pre = engine.prefill(batch, prefix, reserve=config.max_new_tokens)
    logits = pre.logits[:, -1].repeat_interleave(n, dim=0) if n > 1 else pre.logits[:, -1]
    rows = LiveRows(pre, n)
    u = sample_uniforms(config.seed, batch, n, config.max_new_tokens) if sampling else None
    tokens: list[list[int]] = [[] for _ in rows.out]
    raw: list[list[float]] = [[] for _ in rows.out]
    tempered: list[list[float]] = [[] for _ in rows.out]

    for step in range(config.max_new_tokens):
        scores = StepScores(logits, tau)
        chosen = scores.sample(u[rows.out, step]) if sampling else scores.greedy()
        lp, lpt = scores.logprobs(chosen)
        # One host transfer per step for ids and one per log-prob kind.
        ids, lp = chosen.tolist(), lp.tolist()
        lpt = lpt.tolist() if lpt is not None else None
        ended = []
        for j in rows.running():
            r = rows.out[j]
            tokens[r].append(ids[j])
            raw[r].append(lp[j])
            if lpt is not None:
                tempered[r].append(lpt[j])
            if ids[j] in stops.token_ids:
                ended.append(j)
        # Stop strings that span tokens ("Question:"): decode only the tails of rows still going.
        stopped = set(ended)
        going = [j for j in rows.running() if j not in stopped]
        hits = stops.ended_by_text([tokens[rows.out[j]] for j in going])
        ended += [j for j, hit in zip(going, hits, strict=True) if hit]
        rows.finish(ended)
        if on_done is not None and ended:
            on_done(len(ended) / n)
        if rows.alive == 0 or step + 1 == config.max_new_tokens:
            if on_done is not None and rows.alive:
                on_done(rows.alive / n)  # rows cut off by max_new_tokens
            break
        logits = rows.step(engine, chosen)

    gens = [
        stops.split(
            tokens[r], np.asarray(raw[r]), np.asarray(tempered[r]) if tempered[r] else None, config
        )
        for r in range(len(tokens))
    ]
    return [gens[i * n : (i + 1) * n] for i in range(len(batch))]
